// MotorClient: Motor's gRPC API from Java, with stubs generated from protos/ (clients/java/generate.sh).
//
//   clients/java/motor-client .motor/fleet.json
//
// Prints one JSON line per check; exits 1 on the first failed check.
import com.google.gson.Gson;
import com.google.gson.JsonObject;
import com.google.protobuf.Any;
import com.google.protobuf.ByteString;
import com.google.rpc.ErrorInfo;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.MetadataUtils;
import io.netty.handler.ssl.SslContext;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import motor.common.v1.Instance;
import motor.controller.v1.ControllerAdminServiceGrpc;
import motor.controller.v1.ManagedInstance;
import motor.coordinator.v1.DispatchRequest;
import motor.coordinator.v1.DispatchResponse;
import motor.coordinator.v1.DispatchServiceGrpc;
import motor.coordinator.v1.GetInstanceRequest;
import motor.coordinator.v1.GetInstanceResponse;
import motor.coordinator.v1.InstanceRegistryServiceGrpc;
import motor.coordinator.v1.ListInstancesResponse;
import motor.coordinator.v1.OpenAiApi;

public final class MotorClient {
  private static final Gson GSON = new Gson();

  static void report(String check, Map<String, Object> fields) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("check", check);
    line.putAll(fields);
    System.out.println(GSON.toJson(line));
  }

  static String readKey(String path) throws Exception {
    return Files.readString(Path.of(path), StandardCharsets.UTF_8).trim();
  }

  // snippet: channel
  /** A channel to host:port: plaintext, or TLS with the fleet CA and (mutual TLS) a client certificate. */
  static ManagedChannel channel(String target, JsonObject tls) throws Exception {
    if (tls == null) return ManagedChannelBuilder.forTarget(target).usePlaintext().build();
    SslContext ssl = GrpcSslContexts.forClient()
        .trustManager(new File(tls.get("ca_file").getAsString()))            // verifies the servers
        .keyManager(new File(tls.get("cert_file").getAsString()),             // presented to them
                    new File(tls.get("key_file").getAsString()))              // (PKCS#8 PEM key)
        .build();
    return NettyChannelBuilder.forTarget(target).sslContext(ssl).build();
  }
  // end snippet

  // snippet: metadata
  /** Attaches one metadata entry (x-motor-management-key, authorization) to every call of a stub. */
  static io.grpc.ClientInterceptor header(String name, String value) {
    Metadata md = new Metadata();
    md.put(Metadata.Key.of(name, Metadata.ASCII_STRING_MARSHALLER), value);
    return MetadataUtils.newAttachHeadersInterceptor(md);
  }
  // end snippet

  // snippet: reason
  /** The google.rpc.ErrorInfo reason carried in a gRPC error's grpc-status-details-bin trailer. */
  static String reason(StatusRuntimeException e) throws Exception {
    com.google.rpc.Status status = StatusProto.fromThrowable(e);
    if (status == null) return "";
    for (Any detail : status.getDetailsList()) {
      if (detail.is(ErrorInfo.class)) return detail.unpack(ErrorInfo.class).getReason();
    }
    return "";
  }
  // end snippet

  public static void main(String[] args) throws Exception {
    JsonObject fleet = GSON.fromJson(Files.readString(Path.of(args[0])), JsonObject.class);
    String managementKey = readKey(fleet.get("management_key_file").getAsString());
    String inferenceKey = readKey(fleet.get("inference_key_file").getAsString());
    String coordinator = fleet.getAsJsonArray("coordinators").get(0).getAsString();
    JsonObject tls = fleet.get("tls").isJsonNull() ? null : fleet.getAsJsonObject("tls");
    ManagedChannel controllerChannel = channel(fleet.get("controller").getAsString(), tls);
    ManagedChannel coordinatorChannel = channel(coordinator, tls);
    try {
      HealthCheckResponse health = HealthGrpc.newBlockingStub(controllerChannel)
          .withDeadlineAfter(10, TimeUnit.SECONDS)
          .check(HealthCheckRequest.getDefaultInstance());
      report("health", Map.of("status", health.getStatus().name()));

      List<String> ids = new ArrayList<>();
      for (ManagedInstance m : ControllerAdminServiceGrpc.newBlockingStub(controllerChannel)
          .withInterceptors(header("x-motor-management-key", managementKey))
          .withDeadlineAfter(10, TimeUnit.SECONDS)
          .listInstances(motor.controller.v1.ListInstancesRequest.getDefaultInstance())
          .getInstancesList()) {
        ids.add(Long.toUnsignedString(m.getInstance().getId()));  // uint64 is a Java long
      }
      report("controller.ListInstances", Map.of("ids", ids));

      // snippet: registry
      InstanceRegistryServiceGrpc.InstanceRegistryServiceBlockingStub registry =
          InstanceRegistryServiceGrpc.newBlockingStub(coordinatorChannel)
              .withInterceptors(header("x-motor-management-key", managementKey));
      ListInstancesResponse listed = registry.withDeadlineAfter(10, TimeUnit.SECONDS)
          .listInstances(motor.coordinator.v1.ListInstancesRequest.getDefaultInstance());
      long id = listed.getInstances(0).getId();
      GetInstanceResponse got = registry.withDeadlineAfter(10, TimeUnit.SECONDS)
          .getInstance(GetInstanceRequest.newBuilder().setInstanceId(id).build());
      // end snippet
      Instance instance = got.getInstance();
      if (instance.getId() != id) throw new IllegalStateException("GetInstance(" + id + ") answered " + instance.getId());
      report("coordinator.GetInstance", Map.of("id", Long.toUnsignedString(id), "role",
          instance.getRole().name(), "listed", listed.getInstancesCount()));

      // snippet: dispatch
      // DispatchService takes an inference key (authorization: Bearer), not the management key.
      Iterator<DispatchResponse> frames = DispatchServiceGrpc.newBlockingStub(coordinatorChannel)
          .withInterceptors(header("authorization", "Bearer " + inferenceKey))
          .withDeadlineAfter(20, TimeUnit.SECONDS)
          .dispatch(DispatchRequest.newBuilder()
              .setRequestId("java-client-1")
              .setApi(OpenAiApi.OPEN_AI_API_COMPLETIONS)
              .setBody(ByteString.copyFromUtf8(
                  "{\"model\": \"tiny\", \"prompt\": \"Hello\", \"max_tokens\": 4, \"stream\": true}"))
              .build());
      int httpStatus = 0;
      int count = 0;
      StringBuilder body = new StringBuilder();
      while (frames.hasNext()) {
        DispatchResponse frame = frames.next();
        count++;
        if (frame.hasHead()) httpStatus = frame.getHead().getHttpStatus();  // always the first frame
        else body.append(frame.getChunk().toStringUtf8());                  // SSE bytes as the engine sent them
      }
      // end snippet
      report("coordinator.Dispatch", Map.of("http_status", httpStatus, "frames", count,
          "done", body.toString().contains("[DONE]")));

      try {
        registry.withDeadlineAfter(10, TimeUnit.SECONDS)
            .getInstance(GetInstanceRequest.newBuilder().setInstanceId((1L << 53) - 1).build());
        throw new IllegalStateException("GetInstance of an unknown id succeeded");
      } catch (StatusRuntimeException e) {
        report("error", Map.of("code", e.getStatus().getCode().name(), "reason", reason(e)));
      }
    } finally {
      controllerChannel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
      coordinatorChannel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }
}
