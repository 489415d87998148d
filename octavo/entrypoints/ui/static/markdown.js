// A small, safe Markdown renderer for model output.
//
// Safety rule: model text only ever reaches the page through textContent and
// text nodes; elements are made with createElement from a fixed list of tags,
// and the only attribute taken from the text is a link's href, and only when
// it is an http(s) URL. So "<script>" or "<img onerror=...>" in the output
// shows as those characters. Covers what chat models write: paragraphs,
// headings, bullet and numbered lists, block quotes, rules, fenced code
// blocks (an unclosed fence, as while streaming, runs to the end), inline
// code, bold, italics and links.
"use strict";

const OctavoMarkdown = (() => {
  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
  const ORDERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  // Inline: `code`, **bold**, *italic*, [label](http(s) URL). Everything else is text.
  const INLINE = /`([^`\n]+)`|\*\*(?=\S)([^*\n]*?\S)\*\*|\*(?=[^\s*])([^*\n]*?[^\s*])\*|\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g;

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || ORDERED.test(line) ||
      QUOTE.test(line) || RULE.test(line);
  }

  function inline(parent, text) {
    let last = 0;
    INLINE.lastIndex = 0;
    for (let match; (match = INLINE.exec(text)) !== null;) {
      if (match.index > last) parent.appendChild(document.createTextNode(text.slice(last, match.index)));
      last = INLINE.lastIndex;
      const [, code, bold, italic, label, href] = match;
      if (code !== undefined) {
        const node = el("code");
        node.textContent = code;
        parent.appendChild(node);
      } else if (bold !== undefined || italic !== undefined) {
        const node = el(bold !== undefined ? "strong" : "em");
        inline(node, bold !== undefined ? bold : italic);
        parent.appendChild(node);
      } else {
        parent.appendChild(link(label, href));
      }
      INLINE.lastIndex = last; // the recursive call above reused the regex
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function link(label, href) {
    let url;
    try {
      url = new URL(href);
    } catch (ignored) {
      return document.createTextNode(label);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") return document.createTextNode(label);
    const node = el("a");
    node.href = url.href;
    node.rel = "noopener noreferrer nofollow";
    node.target = "_blank";
    node.textContent = label;
    return node;
  }

  function codeBlock(root, lines, start, fence) {
    const marker = fence[1];
    const body = [];
    let i = start + 1;
    while (i < lines.length && !lines[i].trim().startsWith(marker)) body.push(lines[i++]);
    const block = el("div", "code-block");
    const head = el("div", "code-head");
    const language = el("span");
    language.textContent = fence[2] || "code";
    const copy = el("button");
    copy.type = "button";
    copy.textContent = "Copy";
    const code = body.join("\n");
    copy.addEventListener("click", () => {
      navigator.clipboard.writeText(code).then(() => { copy.textContent = "Copied"; }, () => { copy.textContent = "Copy failed"; });
    });
    head.append(language, copy);
    const pre = el("pre");
    const codeNode = el("code");
    codeNode.textContent = code;
    pre.appendChild(codeNode);
    block.append(head, pre);
    root.appendChild(block);
    return i + 1; // past the closing fence
  }

  function list(root, lines, start) {
    const ordered = ORDERED.test(lines[start]);
    const pattern = ordered ? ORDERED : BULLET;
    const node = el(ordered ? "ol" : "ul");
    if (ordered) node.start = Number(ORDERED.exec(lines[start])[1]);
    let i = start;
    let item = null;
    let itemText = [];
    const flush = () => { if (item) inline(item, itemText.join("\n")); };
    while (i < lines.length && lines[i].trim()) {
      const match = pattern.exec(lines[i]);
      if (match) {
        flush();
        item = node.appendChild(el("li"));
        itemText = [match[match.length - 1]];
      } else if (/^\s+\S/.test(lines[i]) && !FENCE.test(lines[i])) {
        itemText.push(lines[i].trim()); // an indented continuation line
      } else {
        break;
      }
      i++;
    }
    flush();
    root.appendChild(node);
    return i;
  }

  function quote(root, lines, start) {
    const inner = [];
    let i = start;
    for (let match; i < lines.length && (match = QUOTE.exec(lines[i])) !== null; i++) inner.push(match[1]);
    const node = el("blockquote");
    node.appendChild(render(inner.join("\n")));
    root.appendChild(node);
    return i;
  }

  function paragraph(root, lines, start) {
    const text = [lines[start]];
    let i = start + 1;
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) text.push(lines[i++]);
    const node = el("p");
    inline(node, text.join("\n"));
    root.appendChild(node);
    return i;
  }

  // Markdown text -> a DocumentFragment of safe nodes.
  function render(text) {
    const root = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let match;
      if ((match = FENCE.exec(line))) {
        i = codeBlock(root, lines, i, match);
      } else if (!line.trim()) {
        i++;
      } else if (RULE.test(line)) {
        root.appendChild(el("hr"));
        i++;
      } else if ((match = HEADING.exec(line))) {
        const heading = el("h" + Math.min(6, match[1].length + 2)); // h3..h6: sized for a chat bubble
        inline(heading, match[2]);
        root.appendChild(heading);
        i++;
      } else if (BULLET.test(line) || ORDERED.test(line)) {
        i = list(root, lines, i);
      } else if (QUOTE.test(line)) {
        i = quote(root, lines, i);
      } else {
        i = paragraph(root, lines, i);
      }
    }
    return root;
  }

  return { render };
})();
