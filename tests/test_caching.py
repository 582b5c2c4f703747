"""The one cache policy (replicas/caching.py): bounded, least recently used out first, identity keys
that hold their object, and one clear for every cache of the process."""

from __future__ import annotations

from replicas.caching import Cache, caches, clear_all


def test_the_least_recently_used_entry_goes_first():
    cache: Cache[int] = Cache("test lru", 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_identity_keys_match_only_the_same_object_and_keep_it_alive():
    cache: Cache[str] = Cache("test identity", 8, by_identity=True)
    key = [1, 2]  # unhashable: only its identity can key it
    cache.put(key, "mine")
    assert cache.get(key) == "mine"
    assert cache.get([1, 2]) is None  # equal, but another object
    made = []
    assert cache.get_or_make(key, lambda: made.append(1) or "other") == "mine" and not made


def test_clear_all_empties_every_cache_of_the_process():
    cache: Cache[int] = Cache("test clear", 4)
    cache.put(1, 1)
    assert cache in caches()
    clear_all()
    assert len(cache) == 0 and cache.get(1) is None


def test_an_entry_that_leaves_is_released_once():
    released: list[str] = []
    cache: Cache[str] = Cache("test evict", 2, on_evict=released.append)  # rp.jax.jit: its job ends
    for k in "abc":
        cache.put(k, k.upper())
    assert released == ["A"] and cache.values() == ["B", "C"]
    cache.clear()
    assert released == ["A", "B", "C"] and len(cache) == 0


def test_pop_takes_an_entry_out_once():
    cache: Cache[str] = Cache("test pop", 4)  # the interpreter pool: one job takes a pooled interpreter
    cache.put("a", "A")
    assert cache.pop("a") == "A" and cache.pop("a") is None and len(cache) == 0
    keyed: Cache[str] = Cache("test pop identity", 4, by_identity=True)
    key = [1]
    keyed.put(key, "mine")
    assert keyed.pop([1]) is None and keyed.pop(key) == "mine"


def test_the_process_wide_caches_are_caching_caches():
    """No module keeps a hand-rolled bounded map (an OrderedDict evicted by hand, a dict cleared when
    full, functools' caches): they are `Cache`s, so `clear_all` reaches them and each has a bound."""
    import re
    from pathlib import Path

    import replicas

    root = Path(replicas.__file__).parent
    hand_rolled = re.compile(r"OrderedDict|popitem\(|lru_cache|functools\.cache\b|@cache\b|"
                             r"if len\(_[A-Z_]+\) [>=]+ .*\n\s*_[A-Z_]+\.clear\(\)")
    found = [f"{path.relative_to(root)}: {m.group(0).splitlines()[0]}"
             for path in sorted(root.rglob("*.py")) if path.name != "caching.py"
             for m in hand_rolled.finditer(path.read_text())]
    assert not found, found
    import replicas.runtime.driver  # noqa: F401  (the caches of the run path)
    import replicas.runtime.interpreter_pool  # noqa: F401

    names = {c.name for c in caches()}
    assert {"compiled programs", "serialized programs", "prepared programs", "static argument shapes",
            "pooled interpreters", "programs without SPMD markers"} <= names
