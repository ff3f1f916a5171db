// Static checks of the frontend sources (node --test): names are user data,
// and the CSP allows no inline script and no external origin.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {readFileSync, readdirSync} from 'node:fs';
import {join, dirname} from 'node:path';
import {fileURLToPath} from 'node:url';

import {functionLengths} from './functions.mjs';

const FRONTEND = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'frontend');
const SOURCES = readdirSync(FRONTEND).filter((f) => f.endsWith('.js'));

// Source without comments, so a comment that warns about innerHTML passes.
function code(f) {
  return readFileSync(join(FRONTEND, f), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:])\/\/.*$/gm, '$1');
}

test('frontend_has_the_files_the_plugin_serves', () => {
  for (const f of ['index.js', 'api.js', 'wire.js', 'colour.js', 'axes.js', 'rows.js', 'format.js', 'findings.js',
    'compare.js', 'selection.js', 'tooltip.js', 'losstrack.js', 'state.js', 'changes.js', 'load.js', 'scene.js',
    'dom.js', 'theme.js', 'controls.js', 'views.js', 'panel.js', 'paint.js', 'pointer.js', 'findingsload.js',
    'trackview.js', 'hook.js', 'heatmap.js', 'chart.js', 'style.css']) {
    assert.ok(readdirSync(FRONTEND).includes(f), f);
  }
});

test('no_html_parsing_sinks_in_frontend_sources', () => {
  for (const f of SOURCES) {
    const src = code(f);
    for (const sink of ['innerHTML', 'outerHTML', 'insertAdjacentHTML', 'document.write', 'eval(', 'new Function']) {
      assert.ok(!src.includes(sink), `${f} uses ${sink}`);
    }
  }
});

test('imports_and_fetches_are_relative', () => {
  for (const f of SOURCES) {
    const src = code(f);
    for (const m of src.matchAll(/\bfrom\s+'([^']+)'/g)) assert.match(m[1], /^\.\/[a-z]+\.js$/, `${f}: import ${m[1]}`);
    assert.ok(!/fetch(Json)?\(\s*['"`]\//.test(src), `${f} fetches an absolute URL`);
    assert.ok(!/https?:\/\//.test(src), `${f} names an external URL`);
  }
});

test('index_exports_render', () => {
  const src = readFileSync(join(FRONTEND, 'index.js'), 'utf8');
  assert.match(src, /export function render\(\)/);
});

// Pure modules touch no DOM and import only pure modules; DOM modules may
// import pure ones, never the reverse (STYLE.md, "Frontend").
const PURE = ['api.js', 'wire.js', 'colour.js', 'axes.js', 'rows.js', 'format.js', 'findings.js', 'compare.js', 'selection.js',
  'tooltip.js', 'losstrack.js', 'state.js', 'changes.js', 'load.js', 'scene.js'];

test('pure_modules_touch_no_dom_and_import_only_pure_modules', () => {
  for (const f of PURE) {
    const src = code(f);
    for (const m of src.matchAll(/\bfrom\s+'\.\/([a-z]+\.js)'/g)) assert.ok(PURE.includes(m[1]), `${f} imports ${m[1]}`);
    const uses = [/(?<![.\w])window\s*\./, /(?<![.\w])document\s*\./, /createElement\(/, /new ImageData\(/, /getContext\(/];
    for (const re of uses) assert.ok(!re.test(src), `${f} touches the DOM: ${re}`);
  }
});

test('every_frontend_module_is_at_most_about_400_lines', () => {
  for (const f of SOURCES) {
    const lines = readFileSync(join(FRONTEND, f), 'utf8').split('\n').length;
    assert.ok(lines <= 460, `${f} has ${lines} lines`);
  }
});

// One small controller and small functions (STYLE.md, "Frontend"): no
// closure holds the whole tab.
const MAX_FUNCTION_LINES = 120;

test('no_frontend_function_is_over_120_lines', () => {
  for (const f of SOURCES) {
    for (const fn of functionLengths(readFileSync(join(FRONTEND, f), 'utf8'))) {
      assert.ok(fn.lines <= MAX_FUNCTION_LINES, `${f}:${fn.line} ${fn.name} has ${fn.lines} lines`);
    }
  }
});

test('function_lengths_count_bodies_not_braces_in_strings_comments_or_regexps', () => {
  const src = [
    'export function outer(a) {', // 1
    "  const s = '{ not a body }'; // {", // 2
    '  const re = /[{(]/g;', // 3
    '  const t = `${a ? `{` : \'}\'}`;', // 4
    '  const inner = (x) => {', // 5
    '    if (x) {', // 6
    '      return {a: 1};', // 7
    '    }', // 8
    '  };', // 9
    '  return inner;', // 10
    '}', // 11
    'class K {', // 12
    '  method(b) {', // 13
    '    return b / 2;', // 14
    '  }', // 15
    '}', // 16
  ].join('\n');
  assert.deepEqual(functionLengths(src), [
    {name: 'outer', line: 1, lines: 11},
    {name: 'inner', line: 5, lines: 5},
    {name: 'method', line: 13, lines: 3},
  ]);
});
