// motor-client: Motor's gRPC API from C++, with stubs generated from protos/ (clients/cpp/generate.sh).
//
//   clients/cpp/motor-client .motor/fleet.json
//
// Prints one JSON line per check; exits 1 on the first failed check.
#include <grpcpp/grpcpp.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "motor/controller/v1/controller.grpc.pb.h"
#include "motor/coordinator/v1/coordinator.grpc.pb.h"

using google::protobuf::Struct;
using google::protobuf::Value;

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::cerr << what << "\n";
  std::exit(1);
}

void Check(const grpc::Status& status, const std::string& call) {
  if (!status.ok()) Fail(call + ": " + std::to_string(status.error_code()) + " " + status.error_message());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Trim(std::string s) {
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

// One JSON line: {"check": CHECK, ...fields}.
void Report(const std::string& check, Struct fields) {
  (*fields.mutable_fields())["check"].set_string_value(check);
  std::string line;
  google::protobuf::util::MessageToJsonString(fields, &line);
  std::cout << line << std::endl;
}

Value Str(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

Value Num(double n) {
  Value v;
  v.set_number_value(n);
  return v;
}

// snippet: channel
// Channel credentials: plaintext, or TLS with the fleet CA and (mutual TLS) a client certificate.
std::shared_ptr<grpc::ChannelCredentials> Credentials(const Value& tls) {
  if (tls.has_null_value()) return grpc::InsecureChannelCredentials();
  const auto& t = tls.struct_value().fields();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(t.at("ca_file").string_value());     // verifies the servers
  options.pem_cert_chain = ReadFile(t.at("cert_file").string_value());   // presented to them
  options.pem_private_key = ReadFile(t.at("key_file").string_value());
  return grpc::SslCredentials(options);
}
// end snippet

// snippet: context
// A call's context: a deadline, and metadata (x-motor-management-key, authorization).
std::unique_ptr<grpc::ClientContext> Context(const std::string& header, const std::string& value) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!header.empty()) ctx->AddMetadata(header, value);
  return ctx;
}
// end snippet

// snippet: reason
// The google.rpc.ErrorInfo reason carried in a gRPC error's grpc-status-details-bin trailer.
std::string Reason(const grpc::Status& status) {
  google::rpc::Status details;
  if (!details.ParseFromString(status.error_details())) return "";
  for (const auto& any : details.details()) {
    google::rpc::ErrorInfo info;
    if (any.UnpackTo(&info)) return info.reason();
  }
  return "";
}
// end snippet

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    default: return "OTHER";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) Fail("usage: motor-client FLEET_JSON");
  Struct fleet;
  if (!google::protobuf::util::JsonStringToMessage(ReadFile(argv[1]), &fleet).ok()) Fail("bad fleet file");
  const auto& f = fleet.fields();
  const std::string management_key = Trim(ReadFile(f.at("management_key_file").string_value()));
  const std::string inference_key = Trim(ReadFile(f.at("inference_key_file").string_value()));
  const auto credentials = Credentials(f.at("tls"));
  auto controller = grpc::CreateChannel(f.at("controller").string_value(), credentials);
  auto coordinator = grpc::CreateChannel(f.at("coordinators").list_value().values(0).string_value(), credentials);

  {
    grpc::health::v1::HealthCheckResponse health;
    Check(grpc::health::v1::Health::NewStub(controller)->Check(Context("", "").get(), {}, &health), "Health/Check");
    Struct out;
    (*out.mutable_fields())["status"] = Str(grpc::health::v1::HealthCheckResponse::ServingStatus_Name(health.status()));
    Report("health", out);
  }
  {
    motor::controller::v1::ListInstancesResponse managed;
    Check(motor::controller::v1::ControllerAdminService::NewStub(controller)->ListInstances(
              Context("x-motor-management-key", management_key).get(), {}, &managed),
          "controller ListInstances");
    Struct out;
    auto* ids = (*out.mutable_fields())["ids"].mutable_list_value();
    for (const auto& m : managed.instances()) *ids->add_values() = Str(std::to_string(m.instance().id()));
    Report("controller.ListInstances", out);
  }

  // snippet: registry
  auto registry = motor::coordinator::v1::InstanceRegistryService::NewStub(coordinator);
  motor::coordinator::v1::ListInstancesResponse listed;
  Check(registry->ListInstances(Context("x-motor-management-key", management_key).get(), {}, &listed),
        "coordinator ListInstances");
  const uint64_t id = listed.instances(0).id();
  motor::coordinator::v1::GetInstanceRequest get;
  get.set_instance_id(id);
  motor::coordinator::v1::GetInstanceResponse got;
  Check(registry->GetInstance(Context("x-motor-management-key", management_key).get(), get, &got), "GetInstance");
  // end snippet
  if (got.instance().id() != id) Fail("GetInstance(" + std::to_string(id) + ") answered " + std::to_string(got.instance().id()));
  {
    Struct out;
    (*out.mutable_fields())["id"] = Str(std::to_string(id));
    (*out.mutable_fields())["role"] = Str(motor::common::v1::Role_Name(got.instance().role()));
    (*out.mutable_fields())["listed"] = Num(listed.instances_size());
    Report("coordinator.GetInstance", out);
  }

  {
    // snippet: dispatch
    // DispatchService takes an inference key (authorization: Bearer), not the management key.
    motor::coordinator::v1::DispatchRequest request;
    request.set_request_id("cpp-client-1");
    request.set_api(motor::coordinator::v1::OPEN_AI_API_COMPLETIONS);
    request.set_body(R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "stream": true})");
    auto ctx = Context("authorization", "Bearer " + inference_key);
    auto reader = motor::coordinator::v1::DispatchService::NewStub(coordinator)->Dispatch(ctx.get(), request);
    motor::coordinator::v1::DispatchResponse frame;
    uint32_t http_status = 0;
    int frames = 0;
    std::string body;
    while (reader->Read(&frame)) {
      ++frames;
      if (frame.has_head()) http_status = frame.head().http_status();  // always the first frame
      else body += frame.chunk();                                       // SSE bytes as the engine sent them
    }
    Check(reader->Finish(), "Dispatch");
    // end snippet
    Struct out;
    (*out.mutable_fields())["http_status"] = Num(http_status);
    (*out.mutable_fields())["frames"] = Num(frames);
    (*out.mutable_fields())["done"].set_bool_value(body.find("[DONE]") != std::string::npos);
    Report("coordinator.Dispatch", out);
  }

  {
    motor::coordinator::v1::GetInstanceRequest unknown;
    unknown.set_instance_id((uint64_t{1} << 53) - 1);
    motor::coordinator::v1::GetInstanceResponse none;
    grpc::Status status = registry->GetInstance(Context("x-motor-management-key", management_key).get(), unknown, &none);
    if (status.ok()) Fail("GetInstance of an unknown id succeeded");
    Struct out;
    (*out.mutable_fields())["code"] = Str(CodeName(status.error_code()));
    (*out.mutable_fields())["reason"] = Str(Reason(status));
    Report("error", out);
  }
  return 0;
}
