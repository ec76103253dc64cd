// The official openai Node SDK's tool loop, as its README shows it, against llmgw: the model asks for a tool,
// the script runs it and sends the result back, until the model answers in words. Prints one JSON line of what
// happened (tool calls with their arguments parsed, the tool's results, the final text, each request's usage) for
// tests/clients/test_node_sdk.py to check. Reads LLMGW_BASE_URL, LLMGW_API_KEY, LLMGW_MODEL; argv: API STREAM
// (API "chat" or "responses", STREAM "stream" or "whole").
import OpenAI from "openai";

const [api, mode] = process.argv.slice(2);
const stream = mode === "stream";
const client = new OpenAI({
  baseURL: process.env.LLMGW_BASE_URL,
  apiKey: process.env.LLMGW_API_KEY,
  maxRetries: 0,
});
const model = process.env.LLMGW_MODEL;
const parameters = {
  type: "object",
  properties: { city: { type: "string", description: "The city's name" } },
  required: ["city"],
  additionalProperties: false,
};
const calls = [];
const results = [];
const usage = [];

// The same text as tests/clients/gateway.py's weather(), which the test compares with.
function getWeather(args) {
  calls.push(args);
  const result = `{"city": "${args.city}", "sky": "sunny", "celsius": 21}`;
  results.push(result);
  return result;
}

async function chatTurn(messages) {
  const request = {
    model,
    messages,
    tools: [{ type: "function", function: { name: "get_weather", description: "Weather now", parameters } }],
  };
  if (!stream) {
    const answer = await client.chat.completions.create(request);
    usage.push(answer.usage ?? null);
    return answer.choices[0].message;
  }
  // The SDK's stream helper assembles the deltas (tool-call arguments arrive in pieces) into one message.
  const runner = client.chat.completions.stream({ ...request, stream_options: { include_usage: true } });
  const done = await runner.finalChatCompletion();
  usage.push(done.usage ?? null);
  return done.choices[0].message;
}

async function chatLoop() {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  for (let turn = 0; turn < 5; turn++) {
    const message = await chatTurn(messages);
    messages.push(message);
    if (!message.tool_calls?.length) return message.content;
    for (const call of message.tool_calls) {
      const result = getWeather(JSON.parse(call.function.arguments));
      messages.push({ role: "tool", tool_call_id: call.id, content: result });
    }
  }
  throw new Error("no final answer after 5 turns");
}

async function responsesTurn(input) {
  const request = {
    model,
    input,
    tools: [{ type: "function", name: "get_weather", description: "Weather now", parameters, strict: true }],
  };
  if (!stream) {
    const answer = await client.responses.create(request);
    usage.push(answer.usage ?? null);
    return answer;
  }
  const events = client.responses.stream(request);
  const answer = await events.finalResponse();
  usage.push(answer.usage ?? null);
  return answer;
}

function textOf(response) {
  const messages = response.output.filter((item) => item.type === "message");
  const parts = messages.flatMap((message) => message.content).filter((part) => part.type === "output_text");
  return parts.map((part) => part.text).join("");
}

async function responsesLoop() {
  const input = [{ role: "user", content: "What is the weather in Paris?" }];
  for (let turn = 0; turn < 5; turn++) {
    const answer = await responsesTurn(input);
    const toolCalls = answer.output.filter((item) => item.type === "function_call");
    // output_text is a convenience of create(); the stream helper's final response has only the items.
    if (!toolCalls.length) return textOf(answer);
    input.push(...answer.output);
    for (const call of toolCalls) {
      const result = getWeather(JSON.parse(call.arguments));
      input.push({ type: "function_call_output", call_id: call.call_id, output: result });
    }
  }
  throw new Error("no final answer after 5 turns");
}

const text = api === "responses" ? await responsesLoop() : await chatLoop();
console.log(JSON.stringify({ calls, results, text, usage }));
