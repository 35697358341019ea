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
