// Server-sent events from a fetch() response (EventSource cannot POST or send
// the key): yields each event's JSON payload, ends at "data: [DONE]" or at
// the end of the body. Aborting the fetch's signal rejects the pending read,
// which closes the connection: the server then aborts the request.
"use strict";

const OctavoSSE = (() => {
  function payloadOf(block) {
    const data = block.split("\n")
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    return data;
  }

  async function* events(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value; // the server frames events with "\n\n"
        for (let end; (end = buffer.indexOf("\n\n")) >= 0;) {
          const data = payloadOf(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (!data) continue;
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  return { events };
})();
