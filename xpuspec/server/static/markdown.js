// A small Markdown renderer for chat replies (fenced code with highlighting, headings, lists, quotes,
// inline code, bold, italic), written for this page. Every character of the output comes from the
// source through text(start, end), so the characters that accepted drafts produced can be wrapped in
// <span class="draft"> wherever the markup puts them. Raw HTML in the source is always escaped.
"use strict";

const Markdown = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (s) => s.replace(/[&<>"']/g, (c) => ESCAPES[c]);

  const KEYWORDS = new Set(
    ("and as assert async await break case catch class const continue def default del do elif else enum " +
      "except export extends false final finally fn for from func function go if impl import in interface " +
      "is lambda let loop match mod mut new nil none None not null or pass pub raise return self static " +
      "struct super switch this throw true True False try type typeof use var void while with yield " +
      "int float str bool char long double unsigned signed echo fi then done esac local").split(" ")
  );
  // One token per match, at the scanning position: comment, string, number, word, anything else.
  const TOKEN = new RegExp(
    [
      String.raw`(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|--[^\n]*)`,
      String.raw`("(?:\\[\s\S]|[^"\\\n])*"?|'(?:\\[\s\S]|[^'\\\n])*'?|\x60(?:\\[\s\S]|[^\x60\\])*\x60?)`,
      String.raw`(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b|\b0x[\da-fA-F]+\b)`,
      String.raw`([A-Za-z_][\w]*)`,
      String.raw`([\s\S])`,
    ].join("|"),
    "y"
  );

  // The runs of a reply as a per-character mask: mask[i] is the index of the accepted-draft run that
  // character i came from, or -1.
  function provenance(runs, length) {
    const mask = new Int32Array(length).fill(-1);
    let offset = 0;
    (runs || []).forEach((run, index) => {
      if (run.accepted_draft) mask.fill(index, offset, Math.min(offset + run.text.length, length));
      offset += run.text.length;
    });
    return mask;
  }

  function render(src, runs) {
    const mask = provenance(runs, src.length);
    const shown = new Set();
    const draftSpan = (index, inner, extra) => {
      shown.add(index);
      return `<span class="draft${extra || ""}" data-run="${index}" data-tokens="${runs[index].tokens}">${inner}</span>`;
    };
    // Source characters [start, end) as HTML, accepted drafts wrapped.
    const text = (start, end) => {
      let out = "";
      for (let i = start; i < end; ) {
        const run = mask[i];
        let j = i + 1;
        while (j < end && mask[j] === run) j += 1;
        const piece = escape(src.slice(i, j));
        out += run < 0 ? piece : draftSpan(run, piece);
        i = j;
      }
      return out;
    };

    function highlight(start, end) {
      const code = src.slice(start, end);
      let out = "";
      TOKEN.lastIndex = 0;
      while (TOKEN.lastIndex < code.length) {
        const m = TOKEN.exec(code);
        const a = start + m.index;
        const b = a + m[0].length;
        let cls = null;
        if (m[1] !== undefined) cls = "hl-com";
        else if (m[2] !== undefined) cls = "hl-str";
        else if (m[3] !== undefined) cls = "hl-num";
        else if (m[4] !== undefined && KEYWORDS.has(m[4])) cls = "hl-kw";
        out += cls ? `<span class="${cls}">${text(a, b)}</span>` : text(a, b);
      }
      return out;
    }

    function inline(start, end) {
      let out = "";
      let plain = start;
      let i = start;
      const flush = (upTo) => {
        if (upTo > plain) out += text(plain, upTo);
      };
      while (i < end) {
        const c = src[i];
        if (c === "`") {
          const close = src.indexOf("`", i + 1);
          if (close > i && close < end) {
            flush(i);
            out += `<code>${text(i + 1, close)}</code>`;
            i = plain = close + 1;
            continue;
          }
        } else if ((c === "*" || c === "_") && src[i + 1] === c) {
          const close = src.indexOf(c + c, i + 2);
          if (close > i + 2 && close < end) {
            flush(i);
            out += `<strong>${inline(i + 2, close)}</strong>`;
            i = plain = close + 2;
            continue;
          }
        } else if ((c === "*" || c === "_") && src[i + 1] && !/\s/.test(src[i + 1])) {
          const close = src.indexOf(c, i + 1);
          if (close > i + 1 && close < end && !/\s/.test(src[close - 1]) && (c === "*" || !/\w/.test(src[i - 1] || ""))) {
            flush(i);
            out += `<em>${inline(i + 1, close)}</em>`;
            i = plain = close + 1;
            continue;
          }
        }
        i += 1;
      }
      flush(end);
      return out;
    }

    // Lines with their offsets.
    const lines = [];
    for (let at = 0; at <= src.length; ) {
      const nl = src.indexOf("\n", at);
      const stop = nl < 0 ? src.length : nl;
      lines.push({ start: at, end: stop, text: src.slice(at, stop) });
      if (nl < 0) break;
      at = nl + 1;
    }

    let html = "";
    let k = 0;
    while (k < lines.length) {
      const line = lines[k];
      const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(line.text);
      if (fence) {
        let j = k + 1;
        while (j < lines.length && !lines[j].text.trim().startsWith(fence[1])) j += 1;
        const bodyStart = k + 1 < lines.length ? lines[k + 1].start : line.end;
        const bodyEnd = j > k + 1 ? lines[j - 1].end : bodyStart;
        const lang = fence[2] ? ` data-lang="${escape(fence[2])}"` : "";
        html += `<pre${lang}><code>${highlight(bodyStart, Math.max(bodyStart, bodyEnd))}</code></pre>`;
        k = j + 1;
        continue;
      }
      const heading = /^(#{1,6})\s+/.exec(line.text);
      if (heading) {
        const level = heading[1].length;
        html += `<h${level}>${inline(line.start + heading[0].length, line.end)}</h${level}>`;
        k += 1;
        continue;
      }
      const item = /^\s*([-*+]|\d+[.)])\s+/;
      if (item.test(line.text)) {
        const ordered = /\d/.test(item.exec(line.text)[1]);
        html += ordered ? "<ol>" : "<ul>";
        while (k < lines.length && item.test(lines[k].text)) {
          const m = item.exec(lines[k].text);
          html += `<li>${inline(lines[k].start + m[0].length, lines[k].end)}</li>`;
          k += 1;
        }
        html += ordered ? "</ol>" : "</ul>";
        continue;
      }
      if (/^>\s?/.test(line.text)) {
        const parts = [];
        while (k < lines.length && /^>\s?/.test(lines[k].text)) {
          const m = /^>\s?/.exec(lines[k].text);
          parts.push(inline(lines[k].start + m[0].length, lines[k].end));
          k += 1;
        }
        html += `<blockquote>${parts.join("<br>")}</blockquote>`;
        continue;
      }
      if (!line.text.trim()) {
        k += 1;
        continue;
      }
      const parts = [];
      while (k < lines.length && lines[k].text.trim() && !/^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d+[.)]\s)/.test(lines[k].text)) {
        parts.push(inline(lines[k].start, lines[k].end));
        k += 1;
      }
      if (!parts.length) {
        parts.push(inline(line.start, line.end)); // never stall on a line no rule took
        k += 1;
      }
      html += `<p>${parts.join("<br>")}</p>`;
    }
    // Accepted drafts nothing of which shows (no text yet, or only newlines and markup) still count:
    // an empty span each, so the page's marks add up to the reply's accepted-draft tokens.
    (runs || []).forEach((run, index) => {
      if (run.accepted_draft && !shown.has(index)) html += draftSpan(index, "", " empty");
    });
    return html;
  }

  return { render, escape };
})();
