"""Hostile TF2 object graphs: every command ends in a result or one clean error, in bounded memory.

Each generator builds a graph of one hostile shape — long chains, wide fans, diamonds
with exponentially many paths, slot variables whose paths double, cycles and
self-references, huge names, too many elements — around the real attributes of a
checkpoint TensorFlow wrote, and embeds it in a copy of that checkpoint. Then
``dump --object-graph`` (text and JSON), ``verify``, ``select --drop-object`` and
``rename`` run on it in-process and as real command-line processes under an address
space limit and a timeout: success or a one-line error, exit status 0/1/2, no
traceback, output linear in the graph's size.
"""

from __future__ import annotations

import resource
import subprocess

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import assert_cli_error, in_process, run_process, user_env  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import inspection as tfinspect  # noqa: E402
from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph  # noqa: E402
from tfckpt.format.objectgraph import MAX_ELEMENTS, OBJECT_GRAPH_KEY, PATH_CHARS  # noqa: E402

ADDRESS_SPACE = 2 << 30  # each command-line process runs under this RLIMIT_AS
TIMEOUT_S = 60
VAR_KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"
TABLE_KEY = "table/.ATTRIBUTES/table"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A TF2 checkpoint TensorFlow wrote (a variable and a lookup table): its tensors and
    the attributes of its graph, to hang on hostile graphs."""
    d = tmp_path_factory.mktemp("graph_base")
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1)
    table.insert(tf.constant([b"a", b"b"]), tf.constant([1, 2], tf.int64))
    prefix = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]), table=table).save(str(d / "ckpt"))
    with tfckpt.open(prefix) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys()}
    graph = TrackableObjectGraph.FromString(tensors[OBJECT_GRAPH_KEY].item())
    attrs = {a.checkpoint_key: a for n in graph.nodes for a in n.attributes}
    assert {VAR_KEY, TABLE_KEY} <= set(attrs)
    return tensors, attrs


# ---------------------------------------------------------------- generators


def _graph(n: int) -> TrackableObjectGraph:
    g = TrackableObjectGraph()
    for _ in range(n):
        g.nodes.add()
    return g


def _link(g, parent: int, child: int, name: str) -> None:
    ref = g.nodes[parent].children.add()
    ref.node_id, ref.local_name = child, name


def _slot(g, holder: int, original: int, slot: int, name: str = "m") -> None:
    s = g.nodes[holder].slot_variables.add()
    s.original_variable_node_id, s.slot_variable_node_id, s.slot_name = original, slot, name


def _hang(g, attrs, node: int, *keys: str) -> None:
    for k in keys:
        g.nodes[node].attributes.add().CopyFrom(attrs[k])


def chain(attrs, n: int, name: str = "c"):
    g = _graph(n + 1)
    for k in range(n):
        _link(g, k, k + 1, name)
    _link(g, 0, n, "v")  # the variable is also reachable at the top, found first
    _hang(g, attrs, n, VAR_KEY)
    _link(g, n // 2, n // 2 + 1, "table")
    _hang(g, attrs, n // 2 + 1, TABLE_KEY)
    return g, [name, "/".join([name] * 3)], {"v/": "w/", "table/": "lookup/"}


def fan(attrs, n: int):
    g = _graph(n + 1)
    for k in range(1, n + 1):
        _link(g, 0, k, f"f{k}")
    _hang(g, attrs, 1, VAR_KEY)
    _hang(g, attrs, n, TABLE_KEY)
    return g, ["f1"], {"v/": "w/"}


def fan_to_one(attrs, n: int):
    g = _graph(2)
    for k in range(n):
        _link(g, 0, 1, "same")
        _link(g, 1, 1, f"self{k % 7}")
    _hang(g, attrs, 1, VAR_KEY, TABLE_KEY)
    return g, ["same"], {"table/": "t/"}


def diamond(attrs, layers: int):
    """Two nodes per layer, each linked to both of the next: 2**layers paths to the bottom."""
    g = _graph(1 + 2 * layers)
    _link(g, 0, 1, "l")
    _link(g, 0, 2, "r")
    for j in range(layers - 1):
        for a in (1 + 2 * j, 2 + 2 * j):
            _link(g, a, 3 + 2 * j, "l")
            _link(g, a, 4 + 2 * j, "r")
    _hang(g, attrs, 2 * layers, VAR_KEY, TABLE_KEY)
    return g, ["l", "r/r/r"], {"v/": "w/"}


def doubling_slots(attrs, n: int):
    """Each slot variable slots for the previous one through itself: its path doubles."""
    g = _graph(n + 2)
    _link(g, 0, 1, "v")
    for k in range(1, n + 1):
        _slot(g, k, k, k + 1)
    _hang(g, attrs, n + 1, VAR_KEY)
    _hang(g, attrs, n // 2, TABLE_KEY)
    return g, ["v"], {"v/": "w/"}


def slot_ladder(attrs, n: int):
    """An optimizer holding a slot for a slot for a slot...: paths grow by a step each."""
    g = _graph(n + 3)
    _link(g, 0, 1, "v")
    _link(g, 0, 2, "optimizer")
    for k in range(n):
        _slot(g, 2, 1 if k == 0 else k + 2, k + 3)
    _hang(g, attrs, n + 2, VAR_KEY, TABLE_KEY)
    return g, ["optimizer"], {"v/": "w/"}


def cycles(attrs, n: int):
    g = _graph(n + 1)
    for k in range(n):
        _link(g, k, k + 1, "next")
        _link(g, k + 1, 0, "root")
        _link(g, k + 1, k + 1, "me")
        _slot(g, k + 1, k + 1, k + 1)
    _link(g, n, 1, "loop")
    _hang(g, attrs, n, VAR_KEY, TABLE_KEY)
    return g, ["loop", "next/next"], {"v/": "w/"}


def self_references(attrs, n: int):
    g = _graph(3)
    _link(g, 0, 0, "root")
    _link(g, 0, 1, "a")
    for _ in range(n):
        _link(g, 1, 1, "a")
        _slot(g, 1, 1, 1)
        _slot(g, 0, 0, 0)
        _slot(g, 1, 2, 1)  # slot for a node nothing reaches
    _hang(g, attrs, 1, VAR_KEY, TABLE_KEY)
    return g, ["root", "a/a/a/a"], {"v/": "w/"}


def long_names(attrs, n: int, size: int):
    g, drops, rename = chain(attrs, n, name="n" * size)
    return g, ["table"], rename


def too_many(attrs, n: int):
    return b"\x0a\x00" * n, ["v"], {"v/": "w/"}  # n empty nodes: only the root is valid


CASES = {
    "chain 10000": (chain, 10000),
    "chain 30000": (chain, 30000),
    "fan 10000": (fan, 10000),
    "fan to one node 20000": (fan_to_one, 20000),
    "diamond 60 layers": (diamond, 60),
    "doubling slots 60": (doubling_slots, 60),
    "slot ladder 2000": (slot_ladder, 2000),
    "cycles 2000": (cycles, 2000),
    "self references 500": (self_references, 500),
    "long names 100x4000": (long_names, 100, 4000),
    "too many nodes": (too_many, MAX_ELEMENTS + 1),
}
IN_PROCESS = [c for c in CASES if c != "chain 30000"]
CLI_CASES = ["chain 30000", "doubling slots 60", "too many nodes"]


@pytest.fixture(scope="module")
def hostile(base, tmp_path_factory):
    """``hostile(case)`` -> (prefix, graph bytes, drop specs, rename rules), built once."""
    tensors, attrs = base
    built = {}

    def get(case: str):
        if case not in built:
            make, *args = CASES[case]
            graph, drops, rename = make(attrs, *args)
            raw = graph if isinstance(graph, bytes) else graph.SerializeToString()
            prefix = tmp_path_factory.mktemp("hostile") / "ckpt"
            tfckpt.save({**tensors, OBJECT_GRAPH_KEY: np.array(raw, dtype=object)}, prefix)
            built[case] = (str(prefix), raw, drops, rename)
        return built[case]

    return get


def _output_bound(raw: bytes) -> int:
    # Linear: every element is printed once, with at most one bounded path.
    return 8 * len(raw) + (len(raw) // 2 + 1) * (PATH_CHARS + 200) + (1 << 20)


# ---------------------------------------------------------------- in-process


@pytest.mark.parametrize("case", IN_PROCESS)
def test_in_process(hostile, case, tmp_path):
    """Library calls and ``cli.main``: the one graph beyond the limits is refused by each."""
    prefix, raw, drops, rename = hostile(case)
    refused = case == "too many nodes"

    def outcome(call):
        try:
            return call()
        except tfckpt.CheckpointError as e:
            assert refused, e
            assert f"more than {MAX_ELEMENTS} elements" in str(e) and prefix in str(e), e
            return None

    with tfckpt.open(prefix) as ckpt:
        data = outcome(lambda: tfinspect.object_graph(ckpt))
    assert (data is None) == refused
    if data is not None:
        assert all(p is None or len(p) <= PATH_CHARS for p in (n["path"] for n in data["nodes"]))
    for argv in (["dump", prefix, "--object-graph"], ["dump", prefix, "--object-graph", "--json"]):
        rc, out, err = in_process(*argv)
        printed = len(out)
        assert rc == (2 if refused else 0) and printed <= _output_bound(raw), (
            argv,
            rc,
            printed,
            err,
        )
        assert rc == 0 or len(err.splitlines()) == 1, err
    problems = tfinspect.verify(prefix)["problems"]
    assert len(problems) == refused, problems
    for k, spec in enumerate(drops):
        done = outcome(lambda: tfckpt.select(prefix, tmp_path / f"drop{k}", drop_objects=[spec]))
        assert (done is None) == refused
        if done:
            assert tfinspect.verify(str(tmp_path / f"drop{k}"))["problems"] == []
    done = outcome(lambda: tfckpt.rename(prefix, tmp_path / "renamed", rename))
    assert (done is None) == refused
    if done:
        out = str(tmp_path / "renamed")
        assert tfinspect.verify(out)["problems"] == []
        with tfckpt.open(out) as ckpt:
            assert not any(k.startswith(tuple(rename)) for k in ckpt.keys())


def test_paths_keep_their_end_when_cut(hostile):
    prefix, *_ = hostile("doubling slots 60")
    with tfckpt.open(prefix) as ckpt:
        nodes = tfinspect.object_graph(ckpt)["nodes"]
    assert nodes[1]["path"] == "v"
    assert nodes[2]["path"] == "v/.OPTIMIZER_SLOT/v/m"
    assert nodes[3]["path"] == "v/.OPTIMIZER_SLOT/v/m/.OPTIMIZER_SLOT/v/.OPTIMIZER_SLOT/v/m/m"
    deep = nodes[61]["path"]  # the end of the path of node 60, then "/m"
    assert len(deep) == PATH_CHARS and deep.startswith("…")
    assert deep[1:] == (nodes[60]["path"][1:] + "/m")[-(PATH_CHARS - 1) :]


# ---------------------------------------------------------------- command-line processes


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_limited(*argv) -> tuple[subprocess.CompletedProcess, int]:
    """``python -m tfckpt ARGV`` under RLIMIT_AS and a timeout; stdout is only counted."""
    proc = run_process(
        *argv,
        env=user_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"),
        timeout=TIMEOUT_S,
        preexec_fn=_limit_address_space,
    )
    return proc, len(proc.stdout)


@pytest.mark.parametrize("case", CLI_CASES)
def test_command_line(hostile, case, tmp_path):
    prefix, raw, drops, rename = hostile(case)
    old, new = next(iter(rename.items()))
    commands = [
        ["dump", prefix, "--object-graph"],
        ["dump", prefix, "--object-graph", "--json"],
        ["verify", prefix],
        ["select", prefix, tmp_path / "selected", "--drop-object", drops[-1]],
        ["rename", prefix, tmp_path / "renamed", "--map", f"{old}={new}"],
    ]
    if case == "too many nodes":  # refused when the graph is parsed, whatever the command
        commands = commands[::3]
    for argv in commands:
        proc, printed = run_limited(*argv)
        stderr = proc.stderr.decode(errors="replace")
        assert proc.returncode in (0, 1, 2), (argv, proc.returncode, stderr[-2000:])
        assert "Traceback" not in stderr and "Error:" not in stderr.replace("error:", ""), (
            argv,
            stderr[-2000:],
        )
        assert printed <= _output_bound(raw), (argv, printed)
        if proc.returncode == 2:
            assert_cli_error(proc)
        if case != "too many nodes":
            assert proc.returncode == 0, (argv, stderr)
        else:
            assert proc.returncode != 0 and f"more than {MAX_ELEMENTS} elements" in stderr, (
                argv,
                stderr,
            )
