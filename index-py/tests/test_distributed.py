"""qkindex.distributed (issue 48): one head sharded by position over Ray actors, on a local Ray
cluster of a head and two worker nodes (each a raylet with its own worker processes) on this
machine. Exact shards give the exact top-k of the whole head; the merged attention is full
attention over the same keys; killed workers are restarted or retried by Ray with the same
answer; a shard lost for good raises ShardLostError. Issue 64: an unavailable replica fails over
to a live one, inserts count once a replica confirmed them, and the replay log of inserts is
bounded by shard snapshots."""

import os
import signal
import time

import numpy as np
import pytest

import qkindex

from conftest import brute_topk, need, ood_data

ray = need("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import qkindex.distributed as qd  # noqa: E402
from qkindex.distributed.merge import _partial_attention  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """A head and two worker nodes; Ray's dashboard is left off (it is not needed, and it costs
    a process and a few seconds on a 2-core machine)."""
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=2), c.add_node(num_cpus=2)]
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def head():
    keys, train, queries = ood_data(n=3000, m=400, b=64, d=32, seed=3)
    rng = np.random.default_rng(4)
    values = rng.standard_normal((len(keys), 24)).astype(np.float32)
    return keys, train, queries, values


def full_attention(queries, keys, values, ids=None):
    """float64 softmax(q.k / sqrt(d)) v, over ``ids[i]`` (``-1`` ignored) or every key."""
    q = np.asarray(queries, np.float64)
    k = np.asarray(keys, np.float64)
    v = np.asarray(values, np.float64)
    z = q @ k.T / np.sqrt(k.shape[1])
    if ids is not None:
        mask = np.zeros_like(z, dtype=bool)
        for i, row in enumerate(ids):
            mask[i, row[row >= 0]] = True
        z = np.where(mask, z, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def test_merges_are_exact_without_ray():
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((500, 16))
    values = rng.standard_normal((500, 5))
    q = rng.standard_normal((7, 16))
    parts = [(0, 120), (120, 400), (400, 500)]
    ids, scores, outs, ms, ls = [], [], [], [], []
    for lo, hi in parts:
        i, s = brute_topk(q, keys[lo:hi], 8)
        ids.append(i + lo)
        scores.append(s.astype(np.float32))
        z = (q @ keys[lo:hi].T) / 4.0
        o, m, l = _partial_attention(z, np.ones_like(z, dtype=bool),
                                        np.broadcast_to(values[lo:hi], (7, hi - lo, 5)))
        outs.append(o), ms.append(m), ls.append(l)
    merged_ids, _ = qd.merge_topk(ids, scores, 8)
    np.testing.assert_array_equal(merged_ids, brute_topk(q, keys, 8)[0])
    out, _, _ = qd.merge_attention(outs, ms, ls)
    np.testing.assert_allclose(out, full_attention(q, keys, values), rtol=0, atol=1e-12)
    # Fewer candidates than k: padded, never invented.
    few_ids, few_scores = qd.merge_topk([ids[0][:, :2]], [scores[0][:, :2]], 4)
    assert (few_ids[:, 2:] == -1).all() and np.isneginf(few_scores[:, 2:]).all()


def test_flat_shards_equal_the_whole_head(cluster, head):
    keys, _, queries, _ = head
    whole = qkindex.FlatIndex.build(keys).search(queries, k=20)
    # SPREAD is best effort (Ray placed all three on one node in one run here); one CPU per
    # actor on nodes of 1, 2 and 2 CPUs makes the spread certain.
    sharded = qd.ShardedIndex.build("flat", keys, shards=3, actor_options={"num_cpus": 1})
    try:
        assert sharded.num_shards == 3 and len(sharded) == len(keys)
        nodes = {r["node"] for shard in sharded.info() for r in shard}
        assert len(nodes) >= 2, "SPREAD placed every shard on one node"
        res = sharded.search(queries, k=20)
        np.testing.assert_array_equal(res.ids, whole.ids)
        np.testing.assert_array_equal(res.scores, whole.scores)
        assert (res.distance_computations == len(keys)).all()
        np.testing.assert_array_equal(res.ids, brute_topk(queries, keys, 20)[0])
        one = sharded.search(queries[5], k=20)
        np.testing.assert_array_equal(one.ids, whole.ids[5])
        # k larger than a shard: each shard answers what it has, the merge is still exact.
        big = sharded.search(queries[:4], k=1500)
        np.testing.assert_array_equal(big.ids, brute_topk(queries[:4], keys, 1500)[0])
    finally:
        sharded.close()


def test_index_shards_keep_the_single_index_recall(cluster, head):
    keys, train, queries, _ = head
    exact = brute_topk(queries, keys, 10)[0]
    opts = {"kq": 50, "degree": 24}
    single = qkindex.build("attention", keys, train, **opts)
    r_single = qkindex.recall(single.search(queries, k=10, ef=24).ids, exact)
    sharded = qd.ShardedIndex.build("attention", keys, train, shards=2, **opts)
    try:
        assert sharded.kind == "AttentionIndex"
        r_sharded = qkindex.recall(sharded.search(queries, k=10, ef=24).ids, exact)
    finally:
        sharded.close()
    # Each shard searches half the keys with the same ef, so it may do better, not worse
    # beyond noise (64 queries x 10 ids).
    assert r_sharded >= r_single - 0.03, (r_sharded, r_single)
    assert r_single > 0.7


def test_merged_attention_is_full_attention_over_the_same_keys(cluster, head):
    keys, _, queries, values = head
    sharded = qd.ShardedIndex.build("flat", keys, shards=3, values=values)
    try:
        att = sharded.attend(queries, k=16)
        assert att.output.shape == (len(queries), values.shape[1]) and att.ids.shape[1] == 48
        ref = full_attention(queries, keys, values, att.ids)
        np.testing.assert_allclose(att.output, ref, rtol=0, atol=1e-5)
        # The keys attended include the global top-16.
        top = brute_topk(queries, keys, 16)[0]
        assert all(set(t) <= set(a) for t, a in zip(top, att.ids))
        # With every key of every shard, it is full attention over the head.
        every = sharded.attend(queries[:8], k=1000)
        np.testing.assert_allclose(every.output, full_attention(queries[:8], keys, values),
                                   rtol=0, atol=1e-5)
        one = sharded.attend(queries[3], k=16)
        np.testing.assert_allclose(one.output, att.output[3], rtol=0, atol=1e-6)
    finally:
        sharded.close()


def test_inserts_fill_the_last_shard_then_open_a_new_one(cluster, head):
    keys, _, queries, values = head
    base, extra = keys[:2000], keys[2000:]
    sharded = qd.ShardedIndex.build("flat", base, shards=2, values=values[:2000], capacity=1300)
    try:
        ids = sharded.insert(extra[:100], values[2000:2100])
        np.testing.assert_array_equal(ids, np.arange(2000, 2100))
        assert sharded.bounds == [(0, 1000), (1000, 2100)]
        sharded.insert(extra[100], values[2100])  # one row
        sharded.insert(extra[101:], values[2101:])  # fills shard 1 to 1300, opens shard 2
        assert sharded.bounds == [(0, 1000), (1000, 2300), (2300, 3000)]
        res = sharded.search(queries, k=20)
        np.testing.assert_array_equal(res.ids, brute_topk(queries, keys, 20)[0])
        att = sharded.attend(queries, k=8)
        np.testing.assert_allclose(att.output, full_attention(queries, keys, values, att.ids),
                                   rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="values"):
            sharded.insert(extra[:1])
    finally:
        sharded.close()


def test_attention_shards_take_inserts_and_open_from_one_key(cluster, head):
    keys, train, queries, _ = head
    sharded = qd.ShardedIndex.build("attention", keys[:1500], train, shards=2, capacity=750,
                                    kq=50, degree=24)
    try:
        sharded.insert(keys[1500])  # the last shard is full: a new one opens with one key
        assert sharded.bounds == [(0, 750), (750, 1500), (1500, 1501)]
        sharded.insert(keys[1501:1600])
        assert sharded.bounds == [(0, 750), (750, 1500), (1500, 1600)]
        exact = brute_topk(queries, keys[:1600], 10)[0]
        assert qkindex.recall(sharded.search(queries, k=10, ef=64).ids, exact) > 0.9
    finally:
        sharded.close()


def test_errors_are_typed_and_name_the_problem(cluster, head):
    keys, _, queries, _ = head
    sharded = qd.ShardedIndex.build("flat", keys[:300], shards=2)
    try:
        with pytest.raises(ValueError, match=r"queries: expected shape \[n, 32\], got \[64, 5\]"):
            sharded.search(queries[:, :5], k=5)
        bad = queries.copy()
        bad[7, 3] = np.nan
        with pytest.raises(ValueError, match="queries: row 7 is not finite"):
            sharded.search(bad, k=5)
        with pytest.raises(ValueError, match=r"k: expected 1 <= k <= 300"):
            sharded.search(queries, k=301)
        with pytest.raises(TypeError, match="float64"):
            sharded.search(queries.astype(np.float64), k=5)
        with pytest.raises(ValueError, match="attend needs values"):
            sharded.attend(queries, k=5)
    finally:
        sharded.close()
    with pytest.raises(ValueError, match="cannot fill"):
        qd.ShardedIndex.build("flat", keys[:2], shards=3)
    # A build error inside an actor reaches the client as its own type and message.
    with pytest.raises(ValueError, match="train_queries"):
        qd.ShardedIndex.build("attention", keys[:300], shards=2)
    hnsw = qd.ShardedIndex.build("hnsw:m=8", keys[:300], shards=2)
    try:
        with pytest.raises(TypeError, match="HnswIndex takes no inserts"):
            hnsw.insert(keys[300])
    finally:
        hnsw.close()


def _wait_restarted(sharded, s, old_pid, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            pid = sharded.info()[s][0]["pid"]
            if pid != old_pid:
                return pid
        except qd.ShardLostError:
            raise
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"shard {s} did not restart within {timeout} s")


def test_a_killed_shard_worker_is_restarted_with_the_same_answer(cluster, head):
    keys, _, queries, values = head
    sharded = qd.ShardedIndex.build("flat", keys[:2500], shards=2, values=values[:2500],
                                    capacity=2000)
    try:
        sharded.insert(keys[2500:], values[2500:])  # shard 1 now holds an insert to replay
        want = sharded.search(queries, k=20)
        want_att = sharded.attend(queries, k=8)
        pid = sharded.info()[1][0]["pid"]
        # Submit a batch to every shard, kill shard 1's worker while the batch is outstanding,
        # then collect: Ray restarts the actor (rebuilding its index from the same object-store
        # keys) and retries the call; the new actor lacks the insert, says so, and the client
        # replays it before taking the answer.
        big = np.repeat(queries, 40, axis=0)
        qref = ray.put(big)
        before = sharded._fan_out("search", qref, 20, {})
        rec = sharded._shards[1]
        h = rec.replicas[0]
        ref = h.search.remote(qref, 20, {}, rec.state())
        os.kill(pid, signal.SIGKILL)
        after = sharded._resolve(1, h, ref, "search", (qref, 20, {}), True)
        np.testing.assert_array_equal(after[0], before[1][0])
        np.testing.assert_array_equal(after[1], before[1][1])
        new_pid = _wait_restarted(sharded, 1, pid)
        assert new_pid != pid
        assert sharded.info()[1][0]["applied"] == 1  # the insert was replayed into the new actor
        res = sharded.search(queries, k=20)
        np.testing.assert_array_equal(res.ids, want.ids)
        np.testing.assert_array_equal(res.scores, want.scores)
        np.testing.assert_array_equal(res.ids, brute_topk(queries, keys, 20)[0])
        att = sharded.attend(queries, k=8)
        np.testing.assert_allclose(att.output, want_att.output, rtol=0, atol=1e-6)
    finally:
        sharded.close()


def test_a_lost_shard_raises_and_a_replica_answers(cluster, head):
    keys, _, queries, _ = head
    want = brute_topk(queries, keys[:600], 10)[0]
    lone = qd.ShardedIndex.build("flat", keys[:600], shards=2,
                                 actor_options={"max_restarts": 0, "max_task_retries": 0})
    try:
        ray.kill(lone._shards[0].replicas[0], no_restart=True)
        with pytest.raises(qd.ShardLostError, match=r"shard 0 \(keys 0\.\.300\) is lost"):
            lone.search(queries, k=10)
        with pytest.raises(qd.ShardLostError):  # and stays lost
            lone.search(queries, k=10)
    finally:
        lone.close()
    twice = qd.ShardedIndex.build("flat", keys[:600], shards=2, replicas=2,
                                  actor_options={"max_restarts": 0, "max_task_retries": 0})
    try:
        ray.kill(twice._shards[1].replicas[0], no_restart=True)
        np.testing.assert_array_equal(twice.search(queries, k=10).ids, want)
        assert len(twice._shards[1].replicas) == 1
    finally:
        twice.close()


def test_an_unavailable_replica_fails_over_to_a_live_one(cluster, head):
    """Issue 64 (a): a replica that Ray is restarting but cannot place (its node is gone and no
    other node has its resource) answers ActorUnavailableError to every call; the shard's other
    replica answers instead, exactly, and takes the inserts."""
    c, _ = cluster
    keys, _, queries, values = head
    slots = [c.add_node(num_cpus=1, resources={"qk_slot": 1}) for _ in range(2)]
    c.wait_for_nodes()
    sharded = None
    try:
        sharded = qd.ShardedIndex.build(
            "flat", keys[:600], shards=1, replicas=2, values=values[:600],
            actor_options={"num_cpus": 0, "resources": {"qk_slot": 1}, "max_restarts": 1,
                           "max_task_retries": 0})
        want = sharded.search(queries, k=10)
        want_att = sharded.attend(queries, k=8)
        first = sharded.info()[0][0]["node"]  # replica 0's node: one replica per slot node
        gone = next(n for n in slots if n.node_id == first)
        c.remove_node(gone)
        slots.remove(gone)
        res = sharded.search(queries, k=10)
        np.testing.assert_array_equal(res.ids, want.ids)
        np.testing.assert_array_equal(res.scores, want.scores)
        np.testing.assert_array_equal(res.ids, brute_topk(queries, keys[:600], 10)[0])
        np.testing.assert_allclose(sharded.attend(queries, k=8).output, want_att.output,
                                   rtol=0, atol=1e-6)
        sharded.insert(keys[600:603], values[600:603])  # confirmed by the live replica
        assert len(sharded) == 603
        np.testing.assert_array_equal(sharded.search(queries, k=10).ids,
                                      brute_topk(queries, keys[:603], 10)[0])
    finally:
        if sharded is not None:
            sharded.close()
        for n in slots:
            c.remove_node(n)


def test_an_insert_no_replica_confirmed_is_not_counted(cluster, head):
    """Issue 64 (b): keys count once a replica has them; an insert that no replica took leaves
    the count, the bounds and the replay log as they were. A replica that missed an insert
    another replica confirmed is replayed before it answers."""
    keys, _, queries, _ = head
    sharded = qd.ShardedIndex.build("flat", keys[:600], shards=2, replicas=2,
                                    actor_options={"max_restarts": 0, "max_task_retries": 0})
    try:
        for h in list(sharded._shards[1].replicas):
            ray.kill(h, no_restart=True)
        with pytest.raises(qd.ShardLostError, match=r"shard 1 \(keys 300\.\.600\) is lost"):
            sharded.insert(keys[600:605])
        assert len(sharded) == 600 and sharded.bounds == [(0, 300), (300, 600)]
        assert len(sharded._shards[1].chunks) == 0
    finally:
        sharded.close()
    twice = qd.ShardedIndex.build("flat", keys[:600], shards=1, replicas=2,
                                  actor_options={"max_restarts": 1, "max_task_retries": 0})
    try:
        a, b = twice._shards[0].replicas
        ray.kill(a, no_restart=False)  # restarting: b confirms the insert, a restarts without it
        twice.insert(keys[600:610])
        assert len(twice) == 610
        ray.kill(b, no_restart=True)  # a answers now, once the insert has been replayed into it
        np.testing.assert_array_equal(twice.search(queries, k=10).ids,
                                      brute_topk(queries, keys[:610], 10)[0])
    finally:
        twice.close()


def test_the_replay_log_is_bounded_by_shard_snapshots(cluster, head):
    """Issue 64 (c): one-row inserts (as decode makes them) are folded into a shard snapshot
    every 256 chunks (the documented default), so the client pins at most that many; a restarted
    replica restores the snapshot and replays only the chunks after it."""
    keys, _, queries, values = head
    sharded = qd.ShardedIndex.build("flat", keys[:600], shards=2, values=values[:600])
    try:
        for i in range(600, 900):
            sharded.insert(keys[i], values[i])
        rec = sharded._shards[-1]
        assert len(rec.chunks) <= 256, f"the replay log holds {len(rec.chunks)} chunks"
        assert len(sharded) == 900 and sharded.bounds == [(0, 300), (300, 900)]
        want = brute_topk(queries, keys[:900], 10)[0]
        np.testing.assert_array_equal(sharded.search(queries, k=10).ids, want)
        want_att = sharded.attend(queries, k=8)
        pid = sharded.info()[1][0]["pid"]
        ray.kill(rec.replicas[0], no_restart=False)  # Ray restarts it (max_restarts 3)
        np.testing.assert_array_equal(sharded.search(queries, k=10).ids, want)
        info = sharded.info()[1][0]
        assert info["pid"] != pid
        assert info["applied"] == 300 and info["restored_at"] == 256, info
        np.testing.assert_allclose(sharded.attend(queries, k=8).output, want_att.output,
                                   rtol=0, atol=1e-6)
    finally:
        sharded.close()
    # The other bound: keys (here 100) in the log, whatever the number of chunks.
    few = qd.ShardedIndex.build("flat", keys[:600], shards=2, snapshot_keys=100)
    try:
        few.insert(keys[600:650])
        assert len(few._shards[-1].chunks) == 1
        few.insert(keys[650:700])
        assert len(few._shards[-1].chunks) == 0 and few._shards[-1].base == 2
        np.testing.assert_array_equal(few.search(queries, k=10).ids,
                                      brute_topk(queries, keys[:700], 10)[0])
    finally:
        few.close()


def _small_dump(tmp_path, n=1200, d=32):
    rng = np.random.default_rng(11)
    layers = {}
    for layer in (2, 5):
        k = rng.standard_normal((2, n, d)).astype(np.float32)
        q = (rng.standard_normal((4, n, d)) * 0.7 + 1.0).astype(np.float32)
        layers[layer] = {"q": q, "k": k}
    qkindex.write_dump(tmp_path / "dump", {"model": "test", "rope_theta": 10000.0}, layers)
    return tmp_path / "dump", layers


def test_build_dump_as_tasks_writes_files_and_refs(cluster, tmp_path):
    dump, layers = _small_dump(tmp_path)
    seen = []
    built = qd.build_dump(dump, "attention", shards=2, out=tmp_path / "out", kq=30,
                          degree=16, progress=lambda done, total, info: seen.append(
                              (done, total, info["layer"], info["kv_head"], info["shard"])))
    assert len(seen) == 8 and seen[-1][:2] == (8, 8)
    assert sorted(s[2:] for s in seen) == [(l, h, s) for l in (2, 5) for h in (0, 1)
                                            for s in (0, 1)]
    again = qd.DumpBuild.read(tmp_path / "out")
    assert again.shard_bounds[(5, 1)] == [(0, 600), (600, 1200)]
    keys = layers[5]["k"][1]
    train = layers[5]["q"][2:4].reshape(-1, 32)
    queries = ood_data(n=10, b=16, d=32, seed=5)[2] + 1.0
    local = qd.ShardedIndex.build("attention", keys, train, shards=2, kq=30, degree=16)
    files = qd.ShardedIndex.open(tmp_path / "out", layer=5, kv_head=1)
    in_store = qd.build_dump(dump, "attention", shards=2, layers=[5], kv_heads=[1], kq=30,
                             degree=16, progress=False)
    refs = qd.ShardedIndex.open(in_store, layer=5, kv_head=1)
    values = np.random.default_rng(12).standard_normal((1200, 8)).astype(np.float32)
    with_values = qd.ShardedIndex.open(tmp_path / "out", layer=5, kv_head=1, values=values,
                                       keys=keys)
    try:
        want = local.search(queries, k=10, ef=32)
        for other in (files, refs):
            assert other.bounds == [(0, 600), (600, 1200)]
            np.testing.assert_array_equal(other.search(queries, k=10, ef=32).ids, want.ids)
        att = with_values.attend(queries, k=10, ef=32)
        np.testing.assert_allclose(att.output, full_attention(queries, keys, values, att.ids),
                                   rtol=0, atol=1e-5)
        with pytest.raises(TypeError, match="opened from files"):
            files.insert(keys[0])
    finally:
        for s in (local, files, refs, with_values):
            s.close()
    with pytest.raises(qkindex.FormatError, match="manifest"):
        qd.DumpBuild.read(tmp_path)


def test_a_whole_dump_on_shard_actors_equals_each_head_exact(cluster, tmp_path):
    dump, layers = _small_dump(tmp_path)
    built = qd.build_dump(dump, "flat", shards=3, out=tmp_path / "flat", progress=False)
    queries = ood_data(n=10, b=6, d=32, seed=7)[2] + 1.0
    q_heads = np.stack([queries + 0.1 * h for h in range(4)])  # [4 query heads, 6, 32]
    for source in (tmp_path / "flat", built,
                   qd.build_dump(dump, "flat", shards=3, layers=[5], progress=False)):
        sharded = qd.ShardedDump.open(source)
        try:
            assert sharded.num_shards == 3 and len(sharded) == 1200
            res = sharded.search(5, q_heads, k=15)
            assert res.ids.shape == (4, 6, 15) and res.distance_computations.shape == (4, 6)
            for h in range(4):  # GQA: query heads 0, 1 read KV head 0; 2, 3 read KV head 1
                exact = brute_topk(q_heads[h], layers[5]["k"][h // 2], 15)[0]
                np.testing.assert_array_equal(res.ids[h], exact)
            with pytest.raises(ValueError, match=r"queries: expected shape \[4, b, 32\]"):
                sharded.search(5, q_heads[:3], k=15)
            with pytest.raises(TypeError, match="no attend"):
                sharded.attend(q_heads, k=5)
        finally:
            sharded.close()


def _pids_titled(title):
    """Processes whose command line (Ray sets a worker's to ``ray::<task>``) starts with
    ``title``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(title):
            out.append(int(pid))
    return out


def _kill_first_titled(title, killed, stop):
    """Kills (SIGKILL) the first process titled ``title`` to appear, polling until ``stop``."""
    while not stop.is_set() and not killed:
        for pid in _pids_titled(title):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            break
        time.sleep(0.02)


def test_a_shard_actor_killed_while_building_is_restarted_with_the_same_index(cluster, head):
    import threading

    keys, train, queries, _ = head
    big = np.concatenate([keys, keys[::-1] + 0.5]).astype(np.float32)  # 6000 keys
    opts = {"kq": 60, "degree": 24}
    killed, stop = [], threading.Event()
    # A shard builds its index on its first call (``info``, which ShardedIndex.build awaits);
    # Ray titles the worker ``ray::_Shard.info`` meanwhile.
    t = threading.Thread(target=_kill_first_titled, args=("ray::_Shard.info", killed, stop))
    t.start()
    try:
        sharded = qd.ShardedIndex.build("attention", big, train, shards=1, **opts)
    finally:
        stop.set()
        t.join()
    try:
        assert killed, "the shard finished its build before it could be killed"
        assert sharded.info()[0][0]["pid"] not in killed
        want = qkindex.build("attention", big, train, **opts).search(queries, k=10, ef=32)
        np.testing.assert_array_equal(sharded.search(queries, k=10, ef=32).ids, want.ids)
    finally:
        sharded.close()


def test_a_build_task_killed_midway_is_retried_with_the_same_index(cluster, tmp_path):
    dump, layers = _small_dump(tmp_path, n=6000)
    opts = {"kq": 60, "degree": 24}
    import threading

    killed, stop = [], threading.Event()
    t = threading.Thread(target=_kill_first_titled,
                         args=("ray::_build_shard_task", killed, stop))
    t.start()
    try:
        qd.build_dump(dump, "attention", shards=1, layers=[2], kv_heads=[0],
                      out=tmp_path / "out", progress=False, **opts)
    finally:
        stop.set()
        t.join()
    assert killed, "the build task finished before it could be killed"
    keys, train = layers[2]["k"][0], layers[2]["q"][0:2].reshape(-1, 32)
    queries = ood_data(n=10, b=16, d=32, seed=6)[2] + 1.0
    want = qkindex.build("attention", keys, train, **opts).search(queries, k=10, ef=32)
    got = qkindex.load(tmp_path / "out" / "layer02.kv0.shard0.qki").search(queries, k=10, ef=32)
    np.testing.assert_array_equal(got.ids, want.ids)
