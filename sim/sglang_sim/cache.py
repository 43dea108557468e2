"""A two-tier, page-granular prefix cache: the device pool (GPU KV) and the HiCache host pool.

A prompt is held in its canonical form: the decimal token ids, each followed by a comma
(b"12,345,6789,"), which the HTTP layer cuts straight out of the JSON body without building a
Python int per token (tokenizer.canonical). That text is cut into blocks of 8 x block_tokens
bytes (SGLANG_SIM_BLOCK_TOKENS, default 128; about 140 tokens a block for a 248K vocab). Each block
is a node keyed by a chained hash of its parent's key and its bytes, so a 128K-token prompt costs
about 1,000 dict look-ups, not a per-token loop. A token counts as cached when its digits and its
comma are inside the matched bytes, so counts are exact to the token: inside the block where two
prompts part, the common prefix is found by comparing byte slices (binary search) and its commas
are counted. With --page-size > 1 hits are rounded down to whole pages.

Each tier has an LRU list. A request touches its path leaf-first, so a parent is always more
recent than its children and eviction takes leaves first. Device eviction keeps the host copy
(write_through backs every computed block up at once; write_back writes on eviction;
write_through_selective backs up a block once it has been hit); without HiCache an evicted block
is gone. The host pool evicts with its own LRU. A block shared by two branches that part inside
it is stored once per branch, so capacity accounting can be off by up to one block per branch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BLOCK_BYTES_PER_TOKEN = 8


class Node:
    __slots__ = ("hits", "key", "lock", "ntok", "on_device", "on_host", "parent", "skey",
                 "tokens")

    def __init__(self, key: int, parent: int, tokens: bytes) -> None:
        self.key = key
        self.parent = parent
        self.tokens = tokens
        self.ntok = tokens.count(b",")
        self.lock = 0
        self.hits = 0
        self.on_device = False
        self.on_host = False
        self.skey: bytes | None = None  # the L3 page hash (storage.page_hash), storage only


@dataclass
class Match:
    device_tokens: int = 0
    host_tokens: int = 0
    path: list[int] = field(default_factory=list)  # keys of nodes used (fully or partly)
    storage_tokens: int = 0  # loaded back (prefetched) from the L3 file storage
    storage_keys: list[str] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int:
        return self.device_tokens + self.host_tokens + self.storage_tokens


def _common_prefix_tokens(a: bytes, b: bytes) -> int:
    """Number of whole tokens (digits and comma) two canonical byte strings start with."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return a.count(b",", 0, lo)


class PrefixCache:
    ROOT = 0

    def __init__(
        self,
        device_capacity: int,
        host_capacity: int,
        page_size: int,
        block_tokens: int,
        write_policy: str = "write_through",
        use_host: bool = True,
        storage=None,
        prefetch_threshold: int = 256,
    ) -> None:
        self.device_capacity = device_capacity
        self.host_capacity = host_capacity if use_host else 0
        self.page_size = max(1, page_size)
        self.block_bytes = max(1, block_tokens) * BLOCK_BYTES_PER_TOKEN
        self.write_policy = write_policy
        self.use_host = use_host and host_capacity > 0
        self.nodes: dict[int, Node] = {}
        self.children: dict[int, set[int]] = {}
        self.device_lru: OrderedDict[int, None] = OrderedDict()
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.device_used = 0
        self.host_used = 0
        self.evicted_device_tokens = 0
        self.evicted_host_tokens = 0
        self.storage = storage  # storage.FileStorage or None
        self.prefetch_threshold = prefetch_threshold

    # ----------------------------------------------------------------- queries
    def _key(self, parent: int, block: bytes) -> int:
        key = hash((parent, block))
        return key if key != self.ROOT else 1

    def _resident(self, node: Node) -> bool:
        return node.on_device or (self.use_host and node.on_host)

    def match(self, data: bytes) -> Match:
        """Longest cached prefix of ``data`` (canonical token bytes), leaving at least the last
        token to compute, as SGLang does, and whole pages when the page size is > 1."""
        end = data.rfind(b",", 0, len(data) - 1) + 1  # the bytes of all tokens but the last
        result = Match()
        step = self.block_bytes
        parent = self.ROOT
        nodes = self.nodes
        for start in range(0, end, step):
            block = data[start:min(start + step, end)]
            key = self._key(parent, block)
            node = nodes.get(key)
            if node is not None and node.tokens == block and self._resident(node):
                self._count(result, node, node.ntok)
                parent = key
                continue
            if not self._from_storage(result, parent, data, start, end):
                self._partial(result, parent, block)
            break
        if self.page_size > 1:
            total = result.cached_tokens // self.page_size * self.page_size
            drop = result.cached_tokens - total
            from_storage = min(drop, result.storage_tokens)
            result.storage_tokens -= from_storage
            drop -= from_storage
            from_host = min(drop, result.host_tokens)
            result.host_tokens -= from_host
            result.device_tokens -= drop - from_host
        return result

    def _prior(self, parent: int) -> bytes | None:
        if parent == self.ROOT:
            return None
        node = self.nodes.get(parent)
        return None if node is None else node.skey

    def _from_storage(self, result: Match, parent: int, data: bytes, start: int,
                      end: int) -> bool:
        """Whole blocks after the device/host match that the L3 storage holds (HiCacheFile
        batch_exists: the longest run of consecutive pages); used only when at least
        prefetch_threshold tokens hit (cache_controller: smaller hits are not prefetched)."""
        if self.storage is None:
            return False
        prior = self._prior(parent)
        if parent != self.ROOT and prior is None:
            return False
        from .storage import page_hash
        step = self.block_bytes
        tokens, keys = 0, []
        for pos in range(start, end, step):
            if pos + step > end:
                break  # the prompt's last (part) block is computed
            block = data[pos:pos + step]
            prior = page_hash(prior, block, self.page_size)
            hexkey = prior.hex()
            if not self.storage.exists(hexkey):
                break
            tokens += block.count(b",")
            keys.append(hexkey)
        if not keys or tokens < self.prefetch_threshold:
            return False
        result.storage_tokens = tokens
        result.storage_keys = keys
        for hexkey in keys:
            self.storage.touch(hexkey)
        return True

    def _count(self, result: Match, node: Node, ntok: int) -> None:
        if node.on_device:
            result.device_tokens += ntok
        else:
            result.host_tokens += ntok
        result.path.append(node.key)

    def _partial(self, result: Match, parent: int, block: bytes) -> None:
        best, best_len = None, 0
        for key in self.children.get(parent, ()):
            node = self.nodes[key]
            if not self._resident(node):
                continue
            shared = _common_prefix_tokens(node.tokens, block)
            if shared > best_len:
                best, best_len = node, shared
        if best is not None and best_len > 0:
            self._count(result, best, best_len)

    # ----------------------------------------------------------------- locking
    def lock(self, path: list[int], delta: int) -> None:
        for key in path:
            node = self.nodes.get(key)
            if node is not None:
                node.lock = max(0, node.lock + delta)

    # ----------------------------------------------------------------- updates
    def insert(self, data: bytes, hit_path: list[int] | None = None) -> int:
        """Cache the blocks of ``data`` on the device (loading host hits back), back them up to
        the host per the write policy, and touch the path. Returns the tokens now cached."""
        for key in hit_path or ():
            node = self.nodes.get(key)
            if node is not None:
                node.hits += 1
        step = self.block_bytes
        parent = self.ROOT
        path: list[Node] = []
        cached = 0
        for start in range(0, len(data), step):
            block = data[start:start + step]
            key = self._key(parent, block)
            node = self.nodes.get(key)
            if node is None or node.tokens != block:
                if node is not None:  # hash collision: keep the old node, stop caching here
                    break
                node = Node(key, parent, block)
                if self.storage is not None:
                    prior = self._prior(parent)
                    if parent == self.ROOT or prior is not None:
                        from .storage import page_hash
                        node.skey = page_hash(prior, block, self.page_size)
                self.nodes[key] = node
                self.children.setdefault(parent, set()).add(key)
            node.lock += 1  # protect the path while making room
            path.append(node)
            if not node.on_device and not self._place_on_device(node):
                break
            if self.use_host and not node.on_host and self._backs_up_now(node):
                self._place_on_host(node)
            cached += node.ntok
            parent = key
        for node in path:
            node.lock -= 1
            if not node.on_device and not node.on_host:
                self._drop(node)
        for node in reversed(path):
            if node.on_device:
                self.device_lru.move_to_end(node.key)
            if node.on_host and node.key in self.host_lru:
                self.host_lru.move_to_end(node.key)
        return cached

    def _backs_up_now(self, node: Node) -> bool:
        if self.write_policy == "write_through":
            return True
        if self.write_policy == "write_through_selective":
            return node.hits >= 1
        return False  # write_back: on eviction

    def _place_on_device(self, node: Node) -> bool:
        if node.ntok > self.device_capacity:
            return False
        while self.device_used + node.ntok > self.device_capacity:
            if not self._evict_device():
                return False
        node.on_device = True
        self.device_used += node.ntok
        self.device_lru[node.key] = None
        return True

    def _place_on_host(self, node: Node) -> bool:
        if node.ntok > self.host_capacity:
            return False
        while self.host_used + node.ntok > self.host_capacity:
            if not self._evict_host():
                return False
        node.on_host = True
        self.host_used += node.ntok
        self.host_lru[node.key] = None
        if self.storage is not None and node.skey is not None:
            # write_backup_storage: every page that reached the host is backed up to L3
            self.storage.backup(node.skey.hex(), node.tokens, node.ntok)
        return True

    def _evict_device(self) -> bool:
        for key in self.device_lru:
            node = self.nodes[key]
            if node.lock == 0:
                break
        else:
            return False
        del self.device_lru[key]
        node.on_device = False
        self.device_used -= node.ntok
        self.evicted_device_tokens += node.ntok
        if self.use_host and not node.on_host:
            backup = self.write_policy == "write_back" or (
                self.write_policy == "write_through_selective" and node.hits >= 1
            )
            if backup:
                self._place_on_host(node)
        if not node.on_host:
            self._drop(node)
        return True

    def _evict_host(self) -> bool:
        for key in self.host_lru:
            node = self.nodes[key]
            if node.lock == 0:
                break
        else:
            return False
        del self.host_lru[key]
        node.on_host = False
        self.host_used -= node.ntok
        self.evicted_host_tokens += node.ntok
        if not node.on_device:
            self._drop(node)
        return True

    def _drop(self, node: Node) -> None:
        """Forget a node held by neither tier, and its descendants (now unreachable)."""
        stack = [node]
        while stack:
            current = stack.pop()
            if self.nodes.get(current.key) is not current:
                continue
            if current.lock:
                continue
            del self.nodes[current.key]
            siblings = self.children.get(current.parent)
            if siblings is not None:
                siblings.discard(current.key)
                if not siblings:
                    del self.children[current.parent]
            if current.on_device:
                current.on_device = False
                self.device_used -= current.ntok
                self.device_lru.pop(current.key, None)
            if current.on_host:
                current.on_host = False
                self.host_used -= current.ntok
                self.host_lru.pop(current.key, None)
            for child in list(self.children.get(current.key, ())):
                stack.append(self.nodes[child])

    def flush(self) -> None:
        self.nodes.clear()
        self.children.clear()
        self.device_lru.clear()
        self.host_lru.clear()
        self.device_used = 0
        self.host_used = 0
