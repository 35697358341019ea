// A Motor gRPC client in TypeScript (Node), generated at run time from protos/ by proto-loader.
//
//   cd clients/ts && npm install && npx tsc && node dist/client.js FLEET_JSON
//
// FLEET_JSON is the fleet.json `motor up` writes (controller, coordinators, management_key_file,
// inference_key_file).
// Prints one JSON line per check; exits 1 on the first failed check.
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { existsSync, readFileSync } from "node:fs";
import protobuf from "protobufjs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// snippet: load
// The repository's root (this file runs as clients/ts/dist/client.js): protos/ and third_party/ are read from there.
const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const LOAD = {
  keepCase: true, // field names as in the .proto (instance_id, not instanceId)
  longs: String, // uint64 ids as decimal strings: exact whatever their size
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [join(ROOT, "protos"), join(ROOT, "third_party", "googleapis"), join(ROOT, "third_party")],
};
const defs = protoLoader.loadSync(
  [
    "motor/controller/v1/controller.proto",
    "motor/coordinator/v1/coordinator.proto",
    "grpc/health/v1/health.proto",
  ],
  LOAD,
);
const pkg = grpc.loadPackageDefinition(defs) as any;
// end snippet

type Tls = { ca_file: string; cert_file: string; key_file: string };
type Fleet = {
  controller: string; coordinators: string[]; management_key_file: string; inference_key_file: string; tls: Tls | null;
};
const fleet: Fleet = JSON.parse(readFileSync(process.argv[2], "utf8"));
// snippet: metadata
// Management calls carry the operator key as metadata.
const key = readFileSync(fleet.management_key_file, "utf8").trim();
const meta = new grpc.Metadata();
meta.set("x-motor-management-key", key);
// end snippet
// snippet: channel
// plaintext, or (motor up --tls) TLS with the fleet CA and the client certificate mutual TLS asks for
// (createSsl takes the CA, then the private key, then the certificate chain)
const creds = fleet.tls
  ? grpc.credentials.createSsl(readFileSync(fleet.tls.ca_file), readFileSync(fleet.tls.key_file),
      readFileSync(fleet.tls.cert_file))
  : grpc.credentials.createInsecure();
// end snippet
// snippet: unary
// A unary call as a promise, with a deadline (every call has one).
const deadline = () => new Date(Date.now() + 10_000);

function unary<T>(client: any, method: string, request: object, md = meta): Promise<T> {
  return new Promise((resolve, reject) =>
    client[method](request, md, { deadline: deadline() }, (err: grpc.ServiceError | null, res: T) =>
      err ? reject(err) : resolve(res),
    ),
  );
}
// end snippet

// snippet: reason
// google.rpc.Status from the grpc-status-details-bin trailer, decoded with protobufjs (which
// proto-loader uses underneath) from the vendored third_party/googleapis protos; its ErrorInfo.reason.
const rpc = new protobuf.Root();
rpc.resolvePath = (_origin: string, target: string) => {
  for (const dir of LOAD.includeDirs) {
    if (existsSync(join(dir, target))) return join(dir, target);
  }
  return target; // google/protobuf/*.proto: protobufjs has them built in
};
rpc.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const StatusType = rpc.lookupType("google.rpc.Status");
const ErrorInfoType = rpc.lookupType("google.rpc.ErrorInfo");

function errorInfoReason(err: grpc.ServiceError): string {
  const raw = err.metadata.get("grpc-status-details-bin")[0] as Buffer | undefined;
  if (!raw) return "";
  const status = StatusType.decode(raw) as any;
  for (const detail of status.details ?? []) {
    if (String(detail.type_url).endsWith("/google.rpc.ErrorInfo")) {
      return (ErrorInfoType.decode(detail.value) as any).reason;
    }
  }
  return "";
}
// end snippet

function report(check: string, detail: object): void {
  console.log(JSON.stringify({ check, ...detail }));
}

async function main(): Promise<void> {
  const health = new pkg.grpc.health.v1.Health(fleet.controller, creds);
  const h = await unary<{ status: string }>(health, "Check", { service: "" }, new grpc.Metadata());
  report("health", { status: h.status });

  const ctl = new pkg.motor.controller.v1.ControllerAdminService(fleet.controller, creds);
  const managed = await unary<{ instances: { instance: { id: string } }[] }>(ctl, "ListInstances", {});
  report("controller.ListInstances", { ids: managed.instances.map((m) => m.instance.id) });

  // snippet: registry
  const coord = new pkg.motor.coordinator.v1.InstanceRegistryService(fleet.coordinators[0], creds);
  const listed = await unary<{ instances: { id: string; role: string }[] }>(coord, "ListInstances", {});
  const id = listed.instances[0].id; // a decimal string (longs: String), passed back unchanged
  const got = await unary<{ instance: { id: string; role: string } }>(coord, "GetInstance", { instance_id: id });
  if (got.instance.id !== id) throw new Error(`GetInstance(${id}) answered ${got.instance.id}`);
  report("coordinator.GetInstance", { id, role: got.instance.role, listed: listed.instances.length });
  // end snippet

  // snippet: dispatch
  const dispatch = new pkg.motor.coordinator.v1.DispatchService(fleet.coordinators[0], creds);
  const body = Buffer.from(JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 4, stream: true }));
  const frames: any[] = await new Promise((resolve, reject) => {
    const out: any[] = [];
    // DispatchService takes an inference key, not the management (operator) key.
    const app = new grpc.Metadata();
    app.set("authorization", `Bearer ${readFileSync(fleet.inference_key_file, "utf8").trim()}`);
    const call = dispatch.Dispatch(
      { request_id: "ts-client-1", api: "OPEN_AI_API_COMPLETIONS", body },
      app,
      { deadline: deadline() },
    );
    call.on("data", (f: any) => out.push(f));
    call.on("error", reject);
    call.on("end", () => resolve(out));
  });
  const head = frames[0].head;
  const text = frames.slice(1).map((f) => Buffer.from(f.chunk).toString()).join("");
  report("coordinator.Dispatch", { http_status: head.http_status, frames: frames.length, done: text.includes("[DONE]") });
  // end snippet

  try {
    await unary(coord, "GetInstance", { instance_id: "9007199254740991" });
    throw new Error("GetInstance of an unknown id succeeded");
  } catch (err: any) {
    report("error", { code: grpc.status[err.code], reason: errorInfoReason(err) });
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
