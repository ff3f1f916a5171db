// The functions of a JavaScript source and their lengths in lines, for the
// static checks (safety.test.mjs): no function of the frontend is over
// MAX_FUNCTION_LINES. A small scanner, not a parser: it blanks comments,
// strings, templates and regular expressions, then pairs braces; a `{` opens
// a function body when it follows `=>` or the `)` of a parameter list named
// by something other than a statement keyword (`function f(`, `f(` in a
// class or object, `constructor(`).

const STATEMENTS = new Set(['if', 'for', 'while', 'switch', 'catch', 'with', 'return', 'typeof', 'await']);
// After these a `/` starts a regular expression, after anything else it divides.
const BEFORE_REGEX = new Set(['', '(', ',', '=', ':', '[', '!', '&', '|', '?', '{', '}', ';', '+', '-', '*', '%', '<', '>', '~', '^']);

/** `src` with comments, strings, templates and regular expressions blanked (newlines kept). */
export function blankLiterals(src) {
  let out = '';
  let i = 0;
  const blank = (text) => text.replace(/[^\n]/g, ' ');
  const lastCode = () => {
    const t = out.trimEnd();
    const m = /(\w+)$/.exec(t);
    if (m) return STATEMENTS.has(m[1]) ? '' : m[1];
    return t.slice(-1);
  };
  // A template's text up to its closing backtick, with ${...} blanked too.
  const template = (start) => {
    let j = start + 1;
    while (j < src.length && src[j] !== '`') {
      if (src[j] === '\\') j += 2;
      else if (src[j] === '$' && src[j + 1] === '{') {
        let depth = 1;
        j += 2;
        while (j < src.length && depth > 0) {
          if (src[j] === '`') j = template(j);
          else if (src[j] === '{') depth++;
          else if (src[j] === '}') depth--;
          j++;
        }
      } else j++;
    }
    return j;
  };
  while (i < src.length) {
    const c = src[i];
    const next = src[i + 1];
    let end = -1;
    if (c === '/' && next === '/') end = src.indexOf('\n', i) < 0 ? src.length : src.indexOf('\n', i);
    else if (c === '/' && next === '*') end = src.indexOf('*/', i + 2) + 2;
    else if (c === "'" || c === '"') {
      end = i + 1;
      while (end < src.length && src[end] !== c) end += src[end] === '\\' ? 2 : 1;
      end++;
    } else if (c === '`') end = template(i) + 1;
    else if (c === '/' && BEFORE_REGEX.has(lastCode())) {
      end = i + 1;
      let inClass = false;
      while (end < src.length && (src[end] !== '/' || inClass)) {
        if (src[end] === '\\') end++;
        else if (src[end] === '[') inClass = true;
        else if (src[end] === ']') inClass = false;
        end++;
      }
      end++;
      while (/\w/.test(src[end] || '')) end++;
    }
    if (end > i) {
      out += c === '/' && (next === '/' || next === '*') ? blank(src.slice(i, end)) : `"${blank(src.slice(i + 2, end))}"`;
      i = end;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

/**
 * Every function of a source: where it starts and how many lines it spans.
 * @param {string} src JavaScript source.
 * @returns {{name: string, line: number, lines: number}[]} line is 1-based;
 *   lines counts the header's line through the closing brace's.
 */
export function functionLengths(src) {
  const code = blankLiterals(src);
  const lineAt = [];
  let line = 1;
  for (const ch of code) {
    lineAt.push(line);
    if (ch === '\n') line++;
  }
  const parens = [];
  const braces = [];
  const found = [];
  let lastParen = null; // [open, close] of the last parameter list closed
  for (let i = 0; i < code.length; i++) {
    const c = code[i];
    if (c === '(') parens.push(i);
    else if (c === ')') lastParen = [parens.pop(), i];
    else if (c === '{') {
      const before = code.slice(0, i).trimEnd();
      let name = null;
      if (before.endsWith('=>')) name = /([\w$]+)\s*=\s*(?:async\s*)?(?:\([^)]*\)|[\w$]+)\s*=>$/.exec(before)?.[1] || '(arrow)';
      else if (lastParen && before.length === lastParen[1] + 1) {
        const head = /([\w$]+)\s*$/.exec(code.slice(0, lastParen[0]));
        if (head && !STATEMENTS.has(head[1])) name = head[1] === 'function' ? '(function)' : head[1];
      }
      braces.push(name === null ? null : {name, line: lineAt[i]});
    } else if (c === '}') {
      const open = braces.pop();
      if (open) found.push({name: open.name, line: open.line, lines: lineAt[i] - open.line + 1});
    }
  }
  return found.sort((a, b) => a.line - b.line);
}
