// The npm `openai` SDK against Motor's gateway: the same checks the Python SDK runs in tests/e2e.
//
//   node dist/openai_check.js http://127.0.0.1:8000/v1 MODEL
//
// Prints one JSON line per check; exits 1 on the first failure.
import OpenAI from "openai";

const [baseURL, model] = [process.argv[2], process.argv[3] ?? "tiny"];
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY ?? "unused", maxRetries: 0, timeout: 20_000 });

function report(check: string, detail: object): void {
  console.log(JSON.stringify({ check, ...detail }));
}

async function apiError(call: () => Promise<unknown>): Promise<object> {
  try {
    await call();
  } catch (err) {
    if (err instanceof OpenAI.APIError) {
      const body = err.error as { type?: string; code?: unknown; param?: unknown } | undefined;
      return { status: err.status, type: body?.type, code: body?.code, param: body?.param ?? null, message: err.message };
    }
    throw err;
  }
  throw new Error("the call succeeded");
}

async function main(): Promise<void> {
  const models = await client.models.list();
  report("models.list", { ids: models.data.map((m) => m.id) });
  const card = await client.models.retrieve(model);
  report("models.retrieve", { id: card.id, object: card.object });
  // vLLM's fields of the engines' own card (present once the coordinator has read it)
  const extra = card as unknown as { max_model_len?: number; root?: string; permission?: unknown[] };
  report("models.card", { max_model_len: extra.max_model_len ?? null, root: extra.root ?? null,
                          permission: Array.isArray(extra.permission) ? extra.permission.length : null });

  const done = await client.completions.create({ model, prompt: "Hello, Motor", max_tokens: 8 });
  report("completions", { text: done.choices[0].text.length > 0, completion_tokens: done.usage?.completion_tokens });

  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 5, stream: true,
  });
  let text = "";
  let chunks = 0;
  for await (const c of stream) {
    chunks++;
    text += c.choices[0]?.delta?.content ?? "";
  }
  report("chat.stream", { chunks, text: text.length > 0 });

  const resp = await client.responses.create({ model, input: "Hello, Motor", max_output_tokens: 4 });
  report("responses", { text: resp.output_text.length > 0, output_tokens: resp.usage?.output_tokens, status: resp.status });
  const events: string[] = [];
  let deltas = "";
  for await (const e of await client.responses.create({ model, input: "Hi", max_output_tokens: 3, stream: true })) {
    events.push(e.type);
    if (e.type === "response.output_text.delta") deltas += e.delta;
  }
  report("responses.stream", { first: events[0], last: events[events.length - 1],
                               deltas: events.filter((t) => t === "response.output_text.delta").length,
                               text: deltas.length > 0 });
  // a stored response (engines with VLLM_ENABLE_RESPONSES_API_STORE=1), retrieved from the engine that made it
  const stored = await client.responses.create({ model, input: "Keep this", max_output_tokens: 2, store: true });
  const again = await client.responses.retrieve(stored.id);
  // (this SDK adds the output_text convenience to create's answer only: compare the output items)
  report("responses.retrieve", { same_id: again.id === stored.id, status: again.status,
                                 same_output: JSON.stringify(again.output) === JSON.stringify(stored.output) });
  report("error.responses.unknown", await apiError(() => client.responses.retrieve("resp_0000000000000000")));
  // (this SDK version has no responses.delete: its generic delete on the same path)
  report("error.responses.delete", await apiError(() => client.delete(`/responses/${stored.id}`)));
  // a generation model's engines serve no embeddings: their 404 in OpenAI's error shape
  report("error.embeddings", await apiError(() => client.embeddings.create({ model, input: "x" })));
  // vLLM's /tokenize and /detokenize (outside /v1: plain fetch, the same API key)
  const root = baseURL.replace(/\/v1\/?$/, "");
  const auth = { "Content-Type": "application/json", Authorization: `Bearer ${process.env.OPENAI_API_KEY ?? "unused"}` };
  const tok = await (await fetch(`${root}/tokenize`, { method: "POST", headers: auth,
                                                      body: JSON.stringify({ model, prompt: "the sun is hot" }) })).json();
  const detok = await (await fetch(`${root}/detokenize`, { method: "POST", headers: auth,
                                                          body: JSON.stringify({ model, tokens: tok.tokens }) })).json();
  report("tokenize", { count: tok.count, prompt: detok.prompt });
  const version = await fetch(`${root}/version`, { headers: auth });
  report("version", { status: version.status, body: await version.json() });

  report("error.unknown_model", await apiError(() => client.completions.create({ model: "no-such-model", prompt: "x" })));
  report("error.engine", await apiError(() => client.completions.create({ model, prompt: "x", max_tokens: -3 })));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
