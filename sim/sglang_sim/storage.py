"""The L3 tier: SGLang 0.5.23's `--hicache-storage-backend file` (HiCacheFile + LRUFileEvictor),
SIMULATED with real files on disk.

As 0.5.23 (srt/mem_cache/hicache_storage.py HiCacheFile, storage/file/lru_file_evictor.py):
- directory: SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, else extra_config "file_storage_path"
  (--file-storage-path is set-defaulted into it), else /tmp/hicache; created if missing.
- one file per page and TP rank: "{page hash}_{model_path with / as -}_{tp_rank}_{tp_size}.bin".
  The page hash is a SHA-256 chain over the page's tokens and the previous page's digest. The
  key holds NOTHING else: no model revision, no KV dtype, no memory layout. A server started on
  the same directory with the same --model-path string and TP size reads pages another model
  revision or KV dtype wrote, as if valid. The simulator does the same.
- size limit: SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE / _MIN_FREE_SPACE parsed by
  human_readable_int ("200G" = 200e9, "1Gi" = 2**30, plain bytes; "0"/unset/invalid = off),
  _EVICTION_RATIO (float in (0, 1], else 0.9). extra_config "max_size", "min_free_space",
  "eviction_ratio" take precedence. The cap is PER TP RANK (each rank's evictor counts only its
  own files), so the directory holds up to tp_size x cap. Over the cap, LRU files are removed
  until total + new <= cap x ratio. Existing files are adopted at startup (oldest mtime first).

The simulator's pages are its cache blocks (SGLANG_SIM_BLOCK_TOKENS); a file holds the block's
canonical token bytes, NUL-padded to tokens x bytes_per_token (the KV bytes a rank stores).
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import threading
import uuid
from collections import OrderedDict
from decimal import Decimal

DEFAULT_DIR = "/tmp/hicache"  # noqa: S108 -- HiCacheFile's default, as 0.5.23


def human_readable_int(value: str) -> int:
    """srt/utils/common.py human_readable_int: SI (k M G T, decimals ok) / IEC (Ki Mi Gi Ti)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        if suffix in iec:
            if "." in number:
                raise ValueError(f"Decimals are not allowed with IEC suffixes like {suffix!r}")
            return int(number) * iec[suffix]
        return int(Decimal(number) * {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[suffix])
    return int(value)


def parse_size(value, log=None) -> int:
    """lru_file_evictor._parse_size_to_bytes: None/''/'0' = off; invalid = off with a warning."""
    if value is None:
        return 0
    if isinstance(value, (int, float)):
        return max(0, int(value))
    s = str(value).strip()
    if not s or s == "0":
        return 0
    try:
        return max(0, human_readable_int(s))
    except ValueError:
        if log:
            log(f"Invalid size {value!r} for HiCacheFile; disabling. (SIMULATOR)", "warning")
        return 0


def page_hash(prior: bytes | None, block: bytes, page_size: int) -> bytes:
    """SHA-256 chain as get_hash_str (prior digest, then the page's tokens). The real hash runs
    per page, so another --page-size gives other keys; the simulator hashes its blocks and mixes
    the page size in to keep that property."""
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    else:
        h.update(b"page_size=%d;" % page_size)
    h.update(block)
    return h.digest()


class FileStorage:
    def __init__(self, *, file_path: str, model_path: str, tp_size: int, page_size: int,
                 bytes_per_token: int, extra: dict, env: dict, log) -> None:
        self.file_path = file_path
        self.log = log
        self.tp_size = tp_size
        self.page_size = page_size
        self.bytes_per_token = max(8, int(bytes_per_token))
        model_name = "-".join(model_path.split("/")) if model_path else ""
        self.suffixes = [f"_{model_name}_{r}_{tp_size}" for r in range(tp_size)]
        if not os.path.exists(file_path):
            os.makedirs(file_path)
            log(f"Created HiCacheFile storage directory at {file_path} (SIMULATOR)")

        def cfg(key: str, name: str, default):
            val = extra.get(key)
            return env.get(name, default) if val is None else val

        self.max_size_bytes = parse_size(cfg("max_size", "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE",
                                             None), log)
        self.min_free_bytes = parse_size(cfg("min_free_space",
                                             "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE", "0"), log)
        try:
            self.eviction_ratio = float(cfg("eviction_ratio",
                                            "SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO", 0.9))
        except (TypeError, ValueError):
            self.eviction_ratio = 0.9
        if not 0.0 < self.eviction_ratio <= 1.0:
            self.eviction_ratio = 0.9
        self.enabled = self.max_size_bytes > 0 or self.min_free_bytes > 0
        # hash hex -> bytes of one rank's file; oldest first (rank 0's evictor; the others
        # hold the same pages and sizes).
        self.lru: OrderedDict[str, int] = OrderedDict()
        self.total_bytes = 0
        self.lock = threading.Lock()
        self.writes = self.reads = self.evictions = 0
        # Backups run off the request path, as 0.5.23's storage backup thread: a request does
        # not wait for its pages to reach the disk (FIFO, one writer: parents before children).
        self.pending: set[str] = set()
        self.queue: queue.Queue = queue.Queue()
        self.writer = threading.Thread(target=self._writer, name="sim-l3-writer", daemon=True)
        self.writer.start()
        if self.enabled:
            fs = self._fs_stats()
            if fs is not None and self.max_size_bytes > 0:
                safe = max(0, fs[0] - self.min_free_bytes)
                if self.max_size_bytes > safe:
                    log(f"HiCacheFile max_size exceeds filesystem capacity; clamping to {safe} B."
                        " (SIMULATOR)", "warning")
                    self.max_size_bytes = safe
            self._scan()
            with self.lock:
                if self.max_size_bytes > 0 and self.total_bytes > self.max_size_bytes:
                    self._evict(0)
            log(f"HiCacheFile eviction enabled: cap={self.max_size_bytes} B, "
                f"watermark={self.eviction_ratio:.2f}, min_free={self.min_free_bytes} B, "
                f"existing={self.total_bytes} B ({len(self.lru)} entries) (SIMULATOR)")

    # ---------------------------------------------------------------- files
    def _path(self, hexkey: str, rank: int) -> str:
        return os.path.join(self.file_path, f"{hexkey}{self.suffixes[rank]}.bin")

    def _fs_stats(self) -> tuple[int, int] | None:
        try:
            st = os.statvfs(self.file_path)
        except OSError:
            return None
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def _scan(self) -> None:
        entries = []
        own = self.suffixes[0] + ".bin"
        for fn in os.listdir(self.file_path):
            if not fn.endswith(own):
                continue
            try:
                st = os.stat(os.path.join(self.file_path, fn))
            except OSError:
                continue
            entries.append((st.st_mtime, fn[: -len(own)], st.st_size))
        entries.sort()
        for _, key, size in entries:
            self.lru[key] = size
            self.total_bytes += size

    def exists(self, hexkey: str) -> bool:
        return all(os.path.exists(self._path(hexkey, r)) for r in range(self.tp_size))

    def touch(self, hexkey: str) -> None:
        """A read hit (get): bump recency; adopt an untracked file (touch in the evictor)."""
        self.reads += 1
        if not self.enabled:
            return
        with self.lock:
            if hexkey in self.lru:
                self.lru.move_to_end(hexkey)
                return
            try:
                size = os.path.getsize(self._path(hexkey, 0))
            except OSError:
                return
            self.lru[hexkey] = size
            self.total_bytes += size

    def backup(self, hexkey: str, block: bytes, ntok: int) -> None:
        """Queue a page for the writer thread (write_backup_storage)."""
        with self.lock:
            if hexkey in self.pending:
                return
            self.pending.add(hexkey)
        self.queue.put((hexkey, block, ntok))

    def _writer(self) -> None:
        while True:
            hexkey, block, ntok = self.queue.get()
            try:
                self.set(hexkey, block, ntok)
            finally:
                with self.lock:
                    self.pending.discard(hexkey)

    def set(self, hexkey: str, block: bytes, ntok: int) -> bool:
        """HiCacheFile.set for every rank: skip (touch) if present, else reserve and write."""
        if self.exists(hexkey):
            if self.enabled:
                with self.lock:
                    if hexkey in self.lru:
                        self.lru.move_to_end(hexkey)
            return True
        size = max(len(block), ntok * self.bytes_per_token)
        if self.enabled:
            with self.lock:
                if not self._reserve(hexkey, size):
                    return False
        payload = block + b"\0" * (size - len(block))
        try:
            for rank in range(self.tp_size):
                tmp = os.path.join(self.file_path, f".{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as f:
                    f.write(payload)
                os.replace(tmp, self._path(hexkey, rank))
        except OSError as err:
            self.log(f"Failed to save tensor {hexkey}: {err} (SIMULATOR)", "error")
            with self.lock:
                cur = self.lru.pop(hexkey, None)
                if cur is not None:
                    self.total_bytes -= cur
            return False
        self.writes += 1
        return True

    def _reserve(self, hexkey: str, size: int) -> bool:
        if self.max_size_bytes > 0 and size > self.max_size_bytes:
            self.log(f"HiCacheFile: value {size} B exceeds cap {self.max_size_bytes} B; "
                     f"not caching {hexkey} (SIMULATOR)", "warning")
            return False
        if self.max_size_bytes > 0 and self.total_bytes + size > self.max_size_bytes:
            self._evict(size)
            if self.total_bytes + size > self.max_size_bytes:
                return False
        if self.min_free_bytes > 0:
            fs = self._fs_stats()
            if fs is not None:
                free = fs[1]
                while self.lru and free + 0 - size < self.min_free_bytes:
                    free += self._evict_one()
                if free - size < self.min_free_bytes:
                    self.log(f"HiCacheFile: filesystem hosting {self.file_path!r} would fall "
                             f"below min_free={self.min_free_bytes} B after writing {size} B; "
                             f"refusing {hexkey} to avoid OOM/ENOSPC. (SIMULATOR)", "warning")
                    return False
        self.lru[hexkey] = size
        self.total_bytes += size
        return True

    def _evict_one(self) -> int:
        key, size = self.lru.popitem(last=False)
        for rank in range(self.tp_size):
            try:
                os.remove(self._path(key, rank))
            except FileNotFoundError:
                pass
        self.total_bytes -= size
        self.evictions += 1
        return size

    def _evict(self, needed: int) -> None:
        target = max(0, int(self.max_size_bytes * self.eviction_ratio) - needed)
        while self.lru and self.total_bytes > target:
            self._evict_one()

    def clear(self) -> bool:
        """POST /hicache/storage-backend/clear, as HiCacheFile.clear: removes EVERY regular file
        in the directory, whichever model or TP layout wrote it."""
        with self.lock:
            try:
                for fn in os.listdir(self.file_path):
                    path = os.path.join(self.file_path, fn)
                    if os.path.isfile(path):
                        os.remove(path)
            except OSError as err:
                self.log(f"Failed to clear HiCacheFile storage: {err} (SIMULATOR)", "error")
                return False
            self.lru.clear()
            self.total_bytes = 0
        self.log("Cleared all entries in HiCacheFile storage. (SIMULATOR)")
        return True

    def snapshot(self) -> dict:
        return {"storage_dir": self.file_path, "storage_max_size_bytes_per_rank":
                self.max_size_bytes, "storage_eviction_ratio": self.eviction_ratio,
                "storage_tracked_bytes_per_rank": self.total_bytes,
                "storage_pages_written": self.writes, "storage_pages_read": self.reads,
                "storage_pages_evicted": self.evictions,
                "storage_pages_pending": len(self.pending)}
