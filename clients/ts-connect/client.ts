// A Motor gRPC client in TypeScript (Node) with Connect-ES v2: messages and service descriptors
// generated from protos/ by protoc-gen-es (buf.gen.yaml), calls over the gRPC protocol.
//
//   cd clients/ts-connect && npm ci && npm run build && node dist/client.js FLEET_JSON
//
// FLEET_JSON is the fleet.json `motor up` writes (controller, coordinators, management_key_file,
// inference_key_file, tls). Prints one JSON line per check; exits 1 on the first failed check.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { readFileSync } from "node:fs";

import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "./gen/grpc/health/v1/health_pb.js";
import { RoleSchema } from "./gen/motor/common/v1/types_pb.js";
import { ControllerAdminService } from "./gen/motor/controller/v1/controller_pb.js";
import {
  DispatchRequestSchema,
  DispatchService,
  InstanceRegistryService,
  OpenAiApi,
} from "./gen/motor/coordinator/v1/coordinator_pb.js";

type Tls = { ca_file: string; cert_file: string; key_file: string };
type Fleet = {
  controller: string; coordinators: string[]; management_key_file: string; inference_key_file: string; tls: Tls | null;
};
const fleet: Fleet = JSON.parse(readFileSync(process.argv[2], "utf8"));
const managementKey = readFileSync(fleet.management_key_file, "utf8").trim();
const inferenceKey = readFileSync(fleet.inference_key_file, "utf8").trim();

// snippet: transport
// Motor speaks gRPC over HTTP/2: createGrpcTransport, not Connect's default createConnectTransport.
// Plaintext, or TLS with the fleet CA and (mutual TLS) the client certificate.
function transport(address: string, tls: Tls | null): Transport {
  if (!tls) return createGrpcTransport({ baseUrl: `http://${address}` });
  return createGrpcTransport({
    baseUrl: `https://${address}`,
    nodeOptions: {
      ca: readFileSync(tls.ca_file),     // verifies the servers
      cert: readFileSync(tls.cert_file), // presented to them
      key: readFileSync(tls.key_file),
    },
  });
}
// end snippet

// snippet: reason
// The google.rpc.ErrorInfo reason carried in a gRPC error's grpc-status-details-bin trailer
// (ErrorInfoSchema is generated from third_party/googleapis/google/rpc/error_details.proto).
function reason(err: unknown): string {
  const info = ConnectError.from(err).findDetails(ErrorInfoSchema)[0];
  return info ? info.reason : "";
}
// end snippet

// Code.NotFound -> "NOT_FOUND", the gRPC name the other clients print.
function grpcCode(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

function report(check: string, detail: object): void {
  console.log(JSON.stringify({ check, ...detail }));
}

async function main(): Promise<void> {
  const controller = transport(fleet.controller, fleet.tls);
  const coordinator = transport(fleet.coordinators[0], fleet.tls);

  const h = await createClient(Health, controller).check({ service: "" }, { timeoutMs: 10_000 });
  report("health", { status: HealthCheckResponse_ServingStatus[h.status] });

  const admin = { headers: { "x-motor-management-key": managementKey }, timeoutMs: 10_000 };
  const managed = await createClient(ControllerAdminService, controller).listInstances({}, admin);
  // uint64 is a bigint in protobuf-es: exact; printed as a decimal string
  report("controller.ListInstances", { ids: managed.instances.map((m) => String(m.instance?.id)) });

  // snippet: registry
  const registry = createClient(InstanceRegistryService, coordinator);
  const options = { headers: { "x-motor-management-key": managementKey }, timeoutMs: 10_000 };
  const listed = await registry.listInstances({}, options);
  const id: bigint = listed.instances[0].id; // uint64 -> bigint, passed back unchanged
  const got = await registry.getInstance({ instanceId: id }, options);
  // end snippet
  if (got.instance?.id !== id) throw new Error(`GetInstance(${id}) answered ${got.instance?.id}`);
  const role = RoleSchema.value[got.instance.role]?.name; // the proto name, ROLE_PREFILL
  report("coordinator.GetInstance", { id: String(id), role, listed: listed.instances.length });

  // snippet: dispatch
  // DispatchService takes an inference key (authorization: Bearer), not the management key.
  const frames = createClient(DispatchService, coordinator).dispatch(
    create(DispatchRequestSchema, {
      requestId: "ts-connect-client-1",
      api: OpenAiApi.COMPLETIONS, // protoc-gen-es drops the enum's OPEN_AI_API_ prefix
      body: new TextEncoder().encode(JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 4, stream: true })),
    }),
    { headers: { authorization: `Bearer ${inferenceKey}` }, timeoutMs: 20_000 },
  );
  let httpStatus = 0;
  let count = 0;
  let body = "";
  const decoder = new TextDecoder();
  for await (const frame of frames) {
    count++;
    if (frame.frame.case === "head") httpStatus = frame.frame.value.httpStatus; // always the first frame
    else if (frame.frame.case === "chunk") body += decoder.decode(frame.frame.value, { stream: true }); // SSE bytes
  }
  // end snippet
  report("coordinator.Dispatch", { http_status: httpStatus, frames: count, done: body.includes("[DONE]") });

  try {
    await registry.getInstance({ instanceId: 2n ** 53n - 1n }, options);
    throw new Error("GetInstance of an unknown id succeeded");
  } catch (err) {
    if (!(err instanceof ConnectError)) throw err;
    report("error", { code: grpcCode(err.code), reason: reason(err) });
  }

  // What Connect's default protocol gets from Motor (docs/clients.md shows the message).
  const scheme = fleet.tls ? "https" : "http";
  const nodeOptions = fleet.tls
    ? { ca: readFileSync(fleet.tls.ca_file), cert: readFileSync(fleet.tls.cert_file), key: readFileSync(fleet.tls.key_file) }
    : {};
  const connect = createConnectTransport({ baseUrl: `${scheme}://${fleet.coordinators[0]}`, httpVersion: "2", nodeOptions });
  try {
    await createClient(InstanceRegistryService, connect).listInstances({}, options);
    report("connect_protocol", { ok: true });
  } catch (err) {
    const e = ConnectError.from(err);
    report("connect_protocol", { ok: false, code: grpcCode(e.code), message: e.message });
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
