"""Property-based tests of every route and parameter, through TensorBoard's real WSGI app and a live `tensorboard`.

The property: whatever the query, the answer is 200, 400 (malformed or
repeated parameter) or 404 (unknown run, metric or file), never 500; and the
answers that must be 200 (a valid selection) are, with a well-formed body.
The logdir holds the awkward cases: a windowed run, a run with only check
data, a run with only unreadable tags, a run with no readable points, and
runs and layers with hostile names.
"""

import base64
import json
import os
import random
import re
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import ROOT
from conftest import TensorBoardProcess
from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from rawlogs import C
from rawlogs import good_run
from rawlogs import stats_content
from rawlogs import stats_points
from rawlogs import write_raw
from tb_gradcheck.core import metadata

BASE = "/data/plugin/gradients/"
ROUTES = ("runs", "heatmap", "compare", "align", "findings", "export", "checks")
KEYS = ("run", "other", "metric", "granularity", "aggregate", "width", "reduce", "format", "encoding", "align")
HOSTILE_RUN = "<img src=x onerror=alert(1)> \"q\" 'q' &a=b%20+#?"
UNICODE_RUN = "日本語 \u202eرن"
HOSTILE_LAYERS = ("<img src=x onerror=alert(1)>", "a\"b'c", "\u202eevil\u200f", "日本語/層", "x" * 300)
FUZZ = settings(
    max_examples=int(os.environ.get("TB_GRADCHECK_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def write_logdir(root):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    good_run(root / "good", steps=30)
    good_run(root / UNICODE_RUN, steps=3, rows=("j/a",))
    v = [tf.Variable(np.ones(3, np.float32), name=n) for n in ("w/a", "w/b")]
    with GradientWriter(root / "windowed", every_n_steps=4) as writer:
        for step in range(21):
            g = np.nan if step == 9 else float(step)
            writer.write([tf.fill([3], np.float32(g)), None if step % 5 == 0 else tf.ones(3)], v, step)
    hostile = [tf.Variable([1.0], name=n) for n in HOSTILE_LAYERS]
    with GradientWriter(root / HOSTILE_RUN) as writer:
        for step in range(5):
            writer.write([tf.constant([1e-12 if i == 0 else 1.0]) for i in range(len(hostile))], hostile, step)
    check = metadata.check_layout("layer", ["c/a", "c/b"])
    write_raw(
        root / "check_only",
        [(s, np.array([[1, 1, 0.0, 0], [1, 2, 0.5, 2]], np.float32)) for s in range(4)],
        content=check,
    )
    write_raw(root / "problems_only", stats_points(2, range(3)), content=dict(stats_content(["p/a", "p/b"]), version=7))
    write_raw(
        root / "no_readable_points", [(s, np.ones((1, 5, C))) for s in range(3)], content=stats_content(["n/a", "n/b"])
    )
    write_raw(
        root / "variable_check_only",
        [(s, np.array([[1, 1, 0.0, 0]], np.float32)) for s in range(3)],
        content=metadata.check_layout("variable", ["v/x"]),
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    write_logdir(root)
    return root


@pytest.fixture(scope="module")
def app(logdir):
    client, _ = make_app(logdir, "python")
    wait_for_steps(client, "good", 30)
    runs = {e["run"]: e for e in get_json(client, BASE + "runs")["runs"]}
    assert set(runs) == {
        "good",
        UNICODE_RUN,
        "windowed",
        HOSTILE_RUN,
        "check_only",
        "problems_only",
        "no_readable_points",
        "variable_check_only",
    }, sorted(runs)
    return client, runs


# -- strategies --------------------------------------------------------------------

RUN_NAMES = [
    "good",
    UNICODE_RUN,
    "windowed",
    HOSTILE_RUN,
    "check_only",
    "problems_only",
    "no_readable_points",
    "variable_check_only",
]
KNOWN = {
    "run": RUN_NAMES,
    "other": RUN_NAMES,
    "metric": list(metadata.STAT_COLUMNS) + [metadata.CHECK_METRIC],
    "granularity": list(metadata.GRANULARITIES),
    "aggregate": list(metadata.AGGREGATES),
    "width": ["1", "2", "7", "100", "100000"],
    "reduce": ["max", "min", "mean"],
    "format": ["csv", "json"],
    "encoding": ["json", "f32"],
    "align": ["name", "structure", "auto"],
}
odd_numbers = st.sampled_from(
    [
        "0",
        "-1",
        "-0",
        "100001",
        "1e3",
        "2.5",
        "NaN",
        "inf",
        " 5",
        "5 ",
        "1_000",
        "\u0663",
        "0x10",
        "9" * 30,
        "+3",
        "",
        "-",
    ]
)
odd_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", " ", "\x00", "..", "../good", "%", "%00", "\u202e", "\ufeff", "good\x00", "GOOD", "good ", "a" * 5000]
)


def value_for(key):
    return st.sampled_from(KNOWN.get(key, ["x"])) | odd_numbers | odd_text


@st.composite
def queries(draw):
    """A list of (key, value) pairs: known keys with known, odd or random values, repeats and unknown keys."""
    keys = draw(st.lists(st.sampled_from(KEYS) | odd_text, max_size=8))
    pairs = [(k, draw(value_for(k))) for k in keys]
    return pairs


def encode(pairs, raw_bytes=b""):
    qs = "&".join(f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}" for k, v in pairs)
    if raw_bytes:  # invalid UTF-8 and stray separators, percent-encoded or not
        qs += "&run=" + urllib.parse.quote_from_bytes(raw_bytes)
    return qs


def check_answer(url, response):
    status = response.status_code
    assert status in (200, 400, 404), (url, status, response.data[:500])
    body = response.get_data()
    if status == 200:
        if "export" in url and "format=json" not in url and response.mimetype == "text/csv":
            body.decode("utf-8")
        else:
            json.loads(body)
    else:
        body.decode("utf-8")  # a plain-text message, not a crash page
    return status


# -- through the WSGI app --------------------------------------------------------------


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    pairs=queries(),
    raw=st.binary(max_size=12) | st.just(b""),
    prefix=st.sampled_from(["", "/experiment/123", "/experiment/%E2%80%AE"]),
)
def test_any_query_on_any_route_answers_200_400_or_404(app, route, pairs, raw, prefix):
    client, _ = app
    url = f"{prefix}{BASE}{route}?{encode(pairs, raw)}"
    check_answer(url, client.get(url))


@FUZZ
@given(
    path=st.lists(
        odd_text | st.sampled_from(["index.js", "..", ".", "static", "style.css", ""]), min_size=1, max_size=4
    ),
    encoded=st.booleans(),
)
def test_static_paths_serve_only_the_tabs_own_files(app, path, encoded):
    client, _ = app
    joined = "/".join(path)
    url = BASE + "static/" + (urllib.parse.quote(joined, safe="") if encoded else urllib.parse.quote(joined, safe="/."))
    response = client.get(url)
    own = {p.name for p in (ROOT / "frontend").iterdir() if p.suffix in (".js", ".css")}
    if joined in own:
        assert response.status_code == 200, url
    else:
        assert response.status_code == 404, (url, response.status_code)


@st.composite
def valid_selections(draw, runs):
    run = draw(st.sampled_from(sorted(r for r, e in runs.items() if e["metrics"] and e["granularities"])))
    entry = runs[run]
    metric = draw(st.sampled_from(entry["metrics"]))
    granularity = draw(st.sampled_from(sorted(g for g, d in entry["granularities"].items() if metric in d["metrics"])))
    aggregate = draw(st.sampled_from(entry["aggregates"][metric]))
    width = draw(st.none() | st.integers(1, 100_000))
    reduce = draw(st.sampled_from(["max", "min", "mean"]))
    encoding = draw(st.sampled_from(["json", "f32"]))
    return run, metric, granularity, aggregate, width, reduce, encoding


def test_valid_selections_always_answer_well_formed_200(app):
    client, runs = app
    assert runs["variable_check_only"]["granularities"].keys() == {"variable"}, runs["variable_check_only"]

    @FUZZ
    @given(selection=valid_selections(runs))
    def check(selection):
        run, metric, granularity, aggregate, width, reduce, encoding = selection
        pairs = [
            ("run", run),
            ("metric", metric),
            ("granularity", granularity),
            ("aggregate", aggregate),
            ("reduce", reduce),
        ] + ([("width", str(width))] if width else [])
        body = get_json(client, BASE + "heatmap?" + encode(pairs))
        assert body["run"] == run and body["layers"] == runs[run]["granularities"][granularity]["rows"]
        assert len(body["values"]) == len(body["steps"]) and all(len(r) == len(body["layers"]) for r in body["values"])
        packed = get_json(client, BASE + "heatmap?" + encode(pairs + [("encoding", encoding)]))
        if encoding == "f32":  # the same matrix, as base64 float32 (missing cells are NaN there)
            decoded = np.frombuffer(base64.b64decode(packed["values_f32"]), "<f4")
            assert decoded.size == len(body["steps"]) * len(body["layers"]), (decoded.size, len(body["steps"]))
        else:
            assert packed == body
        if width is not None:
            assert len(body["steps"]) <= width
        if body["step_ends"] is not None:
            assert len(body["step_ends"]) == len(body["steps"]) and body["reduce"] == reduce
        export = client.get(BASE + "export?" + encode(pairs[:4] + [("format", "csv")]))
        assert export.status_code == 200
        assert export.get_data(as_text=True).count("\n") == body["num_steps"] + 1  # header + one line per step
        disposition = export.headers["Content-Disposition"]
        disposition.encode("latin-1")  # a header must be Latin-1 on the wire
        if metric != metadata.CHECK_METRIC:
            # Against itself: ratios of 1 (or NaN/Inf where the value is 0 or non-finite) at every step.
            same = get_json(client, BASE + "compare?" + encode(pairs + [("other", run)]))
            assert same["layers"] == body["layers"] and same["num_steps"] == body["num_steps"]
            finite = [v for row in same["values"] for v in row if isinstance(v, float)]
            assert all(v == 1.0 for v in finite), finite
        # Against itself by structure: every row is its own partner.
        aligned = get_json(client, BASE + "align?" + encode(pairs[:3] + [("other", run), ("align", "structure")]))
        assert aligned["run_layers"] == aligned["other_layers"] == aligned["layers"] == body["layers"]
        assert get_json(client, BASE + "findings?" + encode(pairs[:1]))["run"] == run

    check()


@FUZZ
@given(run=odd_text.filter(lambda r: r not in RUN_NAMES), metric=st.sampled_from(["grad_norm", "check_error"]))
def test_unknown_runs_answer_404_on_every_route(app, run, metric):
    client, _ = app
    q = encode([("run", run), ("metric", metric), ("other", "good")])
    for route in ("heatmap", "compare", "align", "findings", "export"):
        response = client.get(f"{BASE}{route}?{q}")
        if run == "":
            assert response.status_code == 400, (route, run)  # a missing required parameter
        elif metric == "check_error" and route == "compare":
            assert response.status_code in (400, 404), (route, run)
        else:
            assert response.status_code == 404, (route, run, response.data[:200])


@FUZZ
@given(
    width=odd_numbers.filter(lambda w: w != ""),
    key=st.sampled_from(["width", "granularity", "reduce", "run", "metric"]),
)
def test_malformed_or_repeated_parameters_answer_400(app, width, key):
    client, _ = app
    base = [("run", "good"), ("metric", "grad_norm")]
    assert client.get(BASE + "heatmap?" + encode(base + [("width", width)])).status_code == 400, width
    repeated = base + [(key, KNOWN[key][0])] * 2
    assert client.get(BASE + "heatmap?" + encode(repeated)).status_code == 400, key


def test_hostile_names_come_back_as_data(app):
    client, runs = app
    assert runs[HOSTILE_RUN]["granularities"]["layer"]["rows"] == list(HOSTILE_LAYERS)
    q = encode([("run", HOSTILE_RUN), ("metric", "grad_norm")])
    body = get_json(client, BASE + "heatmap?" + q)
    assert body["run"] == HOSTILE_RUN and body["layers"] == list(HOSTILE_LAYERS)
    findings = get_json(client, BASE + "findings?" + encode([("run", HOSTILE_RUN)]))["findings"]
    assert findings and findings[0]["layers"] == ["<img src=x onerror=alert(1)>"]
    export = client.get(BASE + "export?" + q)
    name = export.headers["Content-Disposition"]
    assert re.fullmatch(r'attachment; filename="[A-Za-z0-9_.-]+"; filename\*=UTF-8\'\'[A-Za-z0-9_.%-]+', name), name


def test_path_prefix_deployment_serves_and_refuses_the_same(logdir):
    client, _ = make_app(logdir, "python", ["--path_prefix", "/pre/fix"])
    assert get_json(client, "/pre/fix" + BASE + "runs")["runs"]
    assert client.get("/pre/fix" + BASE + "static/index.js").status_code == 200
    for path in ("static/static/index.js", "static/../static/index.js", "static/%2e%2e/plugin.py", "static/"):
        assert client.get("/pre/fix" + BASE + path).status_code == 404, path


# -- a live tensorboard ------------------------------------------------------------------

LIVE_REQUESTS = 400
LIVE_SECONDS = 40


def random_query(rng):
    """A request in the spirit of the strategies above, from a seeded generator (the live loop is not hypothesis)."""
    route = rng.choice(ROUTES + ("static/index.js", "static/" + rng.choice(["..%2Fplugin.py", "nope.js", "%00"])))
    pairs = []
    for _ in range(rng.randrange(0, 7)):
        key = rng.choice(KEYS + ("", "x", "\u202e"))
        roll = rng.random()
        if roll < 0.6:
            value = rng.choice(KNOWN.get(key, ["x"]))
        elif roll < 0.8:
            value = rng.choice(["0", "-1", "1e3", "9" * 30, "", "\x00", "%", "\u0663", "a" * 3000, "<img src=x>"])
        else:
            value = "".join(chr(rng.randrange(1, 0x2FFFF)) for _ in range(rng.randrange(0, 12)))
            value = value.encode("utf-8", "replace").decode("utf-8", "replace")
        pairs.append((key, value))
    try:
        qs = encode(pairs)
    except UnicodeEncodeError:
        qs = ""
    return f"{BASE}{route}?{qs}"


def test_live_tensorboard_answers_no_5xx_to_a_request_loop(logdir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    tb = TensorBoardProcess(logdir, env=env)
    try:
        tb.wait_for_steps("good", 30)
        rng = random.Random(7)
        counts, deadline, made = {}, time.time() + LIVE_SECONDS, 0
        while made < LIVE_REQUESTS and time.time() < deadline:
            url = random_query(rng)
            status, body = tb.get(url)
            counts[status] = counts.get(status, 0) + 1
            assert status in (200, 400, 404), (url, status, body[:500])
            made += 1
        # The valid selection of every run, and a hostile run's export (its header must survive the wire).
        for run in RUN_NAMES:
            status, _ = tb.get(BASE + "findings?" + encode([("run", run)]))
            assert status == 200, run
        status, body = tb.get(BASE + "export?" + encode([("run", HOSTILE_RUN), ("metric", "grad_norm")]))
        assert status == 200 and body.startswith(b"step,<img src=x onerror=alert(1)>"), (status, body[:200])
        # A non-Latin-1 download name must not break the response headers on the wire.
        url = tb.url + BASE + "export?" + encode([("run", UNICODE_RUN), ("metric", "grad_norm")])
        with urllib.request.urlopen(url, timeout=30) as response:
            disposition = response.headers["Content-Disposition"]
            assert response.status == 200 and response.read().startswith(b"step,j/a\n")
        assert urllib.parse.quote(UNICODE_RUN.replace(" ", "_"), safe="")[:27] in disposition, disposition
        log = tb.output()
    finally:
        tb.close()
    print(f"live loop: {made} requests, status counts {dict(sorted(counts.items()))}")
    assert made >= 100 and counts.get(200, 0) > 10 and counts.get(404, 0) > 10, counts
    assert "Traceback" not in log, log[-3000:]
