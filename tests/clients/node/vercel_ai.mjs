// The Vercel AI SDK's tool loop (`ai` with `@ai-sdk/openai-compatible`), as its docs show it, against llmgw:
// generateText or streamText with a tool that has `execute`, and stopWhen letting the SDK send the tool's result
// back until the model answers in words. Prints one JSON line of what happened (the steps' tool calls and
// results, the final text and finish reason, the total usage) for tests/clients/test_vercel_ai.py to check.
// Reads LLMGW_BASE_URL, LLMGW_API_KEY, LLMGW_MODEL; argv: STREAM ("stream" or "whole").
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const stream = process.argv[2] === "stream";
const provider = createOpenAICompatible({
  name: "llmgw",
  baseURL: process.env.LLMGW_BASE_URL,
  apiKey: process.env.LLMGW_API_KEY,
  includeUsage: true, // asks for the usage chunk at the end of a stream (stream_options.include_usage)
});
const calls = [];
const tools = {
  getWeather: tool({
    description: "The weather in a city now",
    inputSchema: z.object({ city: z.string().describe("The city's name") }),
    execute: async ({ city }) => {
      calls.push({ city });
      return { city, sky: "sunny", celsius: 21 };
    },
  }),
};
const request = {
  model: provider(process.env.LLMGW_MODEL),
  tools,
  stopWhen: stepCountIs(5),
  prompt: "What is the weather in Paris?",
  maxRetries: 0,
};

let result;
if (stream) {
  const streamed = streamText({ ...request, onError: ({ error }) => { throw error; } });
  const deltas = [];
  for await (const part of streamed.textStream) deltas.push(part);
  result = {
    text: await streamed.text,
    deltas,
    finishReason: await streamed.finishReason,
    usage: await streamed.totalUsage,
    steps: await streamed.steps,
  };
} else {
  const whole = await generateText(request);
  result = { text: whole.text, finishReason: whole.finishReason, usage: whole.totalUsage, steps: whole.steps };
}
const steps = result.steps.map((step) => ({
  finishReason: step.finishReason,
  toolCalls: step.toolCalls.map((c) => ({ toolName: c.toolName, input: c.input })),
  toolResults: step.toolResults.map((r) => ({ toolName: r.toolName, output: r.output })),
  text: step.text,
}));
console.log(JSON.stringify({ ...result, calls, steps }));
