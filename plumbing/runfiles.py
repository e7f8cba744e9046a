"""
Nothing lost: how this project writes files. A reader of a training loop never needs
to open this module; the scripts call it through training.Run in a few places.

  RunFolder       a run's out_dir: locked first, known by its manifest.json, never
                  silently reused, left as found when the run is refused
  write_file      atomic: a pid-named temp file beside the path, then a rename; a link
                  at the path is refused; a full disk is one line and leaves no temp file
  write_json      write_file of strict JSON (NaN and inf as null)
  append_record   strict-JSON lines at the end of a JSONL file (a log)
  read_records    a JSONL file's records; a last line cut short by a kill is dropped
  claim_outputs   a folder that is not a run (--report, --compare) before writing into it
  read_manifest   which script wrote a folder, and which files
  load_checkpoint a checkpoint read weights-only (no code runs) and checksummed
  data_fingerprint  a hash of the training data: a resumed run refuses other data

A folder this project writes into holds manifest.json: the script, a run id, the
writer's pid and every file written there, each listed before it exists. Clean-up
and --overwrite remove only listed files; an unlisted file refuses the folder.
"""

import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import stat
import sys
import time
import zipfile

import numpy as np
import torch

_TMP_PREFIX = ".sptflt-tmp"    # temp files: .sptflt-tmp.<pid>.<name>, so a writer's own, and a dead
                               # writer's, are told from anything else by name and pid alone
_MANIFEST = "manifest.json"
_RESULT_FILES = ("config.json", "log.jsonl", "summary.json", "ckpt.pt")
_HELD = {}                     # real path of a folder -> the _Manifest of it this process holds
_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")   # torch.save on a full disk


# -----------------------------------------------------------------------------
# Writing: by rename from a temp file, never through a link, as strict JSON

def write_file(path, content):
    """Write `content` (str, bytes, or a function that writes into a binary file) to a
    new temp file beside `path` (O_EXCL | O_NOFOLLOW), then rename it to `path`. A link
    at `path` is refused. On failure the temp file is removed; a full disk (torch.save
    says so with a RuntimeError) is an OSError(ENOSPC) naming the file. A file written
    into a folder this process holds joins its manifest first."""
    _refuse_link(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder; give a file path")
    held = _HELD.get(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    if held is not None:
        held.claim(os.path.basename(path))                 # listed before it exists: never unlisted
    write = content if callable(content) else lambda f: f.write(content.encode() if isinstance(content, str)
                                                               else content)
    tmp = _temp_path(path)
    try:
        if os.path.lexists(tmp):                           # this pid's own leftover
            os.remove(tmp)
        with _open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free   # before the temp file is freed
        if os.path.lexists(tmp):
            os.remove(tmp)
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free < 2**20:
            raise OSError(errno.ENOSPC, f"no space left to write {path}; free some space, then "
                                        f"{_then(path)}") from None
        if isinstance(e, RuntimeError) and any(s in str(e) for s in _WRITE_FAILED):
            raise OSError(errno.EIO, f"could not write {path} ({str(e).splitlines()[0][:160]}); check the "
                                     f"disk, then {_then(path)}") from None
        raise


def _then(path):
    """What to do once the disk takes writes again: resume from the folder's ckpt.pt if
    it has one, else start the run again."""
    folder = os.path.dirname(os.path.abspath(path))
    return ("continue with --init_from=resume" if os.path.exists(os.path.join(folder, "ckpt.pt")) else
            "start it again with --overwrite=True (no checkpoint was written yet)")


def write_json(path, obj):
    write_file(path, _to_json(obj, indent=2))


def append_record(path, *records):
    """One strict-JSON line a record at the end of a JSONL file: created by write_file
    when absent, else opened O_APPEND without following a link."""
    line = "".join(_to_json(r) + "\n" for r in records)
    if not os.path.lexists(path):
        return write_file(path, line)
    try:
        with _open_nofollow(path, os.O_WRONLY | os.O_APPEND) as f:
            f.write(line)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"no space left to write {path}; free some space, then continue with "
                                   f"--init_from=resume") from None
        raise


def _to_json(obj, indent=None):
    """Strict JSON text: NaN and inf are written as null, numpy scalars as numbers."""
    return json.dumps(_strict(obj), indent=indent, allow_nan=False)


def _strict(obj):
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def read_records(path):
    """The records of a JSONL file (blank lines skipped), for a resume and for a figure of
    a run that may still be writing: a last line that is not JSON (cut short by a kill, or
    being written now) is dropped with a warning on stderr; a bad line anywhere else is
    damage, and raises ValueError naming the file and the line."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}, line {i + 1}: not a JSON record; the file is damaged") from None
            print(f"warning: {path}: dropped its last line, cut short ({line[:40]!r}...)", file=sys.stderr)
    return records


def _temp_path(path):
    folder, name = os.path.split(path)
    return os.path.join(folder, f"{_TMP_PREFIX}.{os.getpid()}.{name[:120]}")


def _temp_owner(name):
    """The pid in a temp file's name, or None for a name that is not one of ours."""
    parts = name.split(".", 3)
    if name.startswith(_TMP_PREFIX + ".") and len(parts) == 4 and parts[2].isdigit():
        return int(parts[2])
    return None


def _refuse_link(path):
    if os.path.islink(path):
        raise FileExistsError(f"{path} is a symbolic link; this project never writes through one: remove it "
                              f"or choose another path")


def _open_nofollow(path, flags, mode="w"):
    """os.open(path, flags | O_NOFOLLOW) as a file object; a link there is one line."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            _refuse_link(path)
        raise
    return os.fdopen(fd, mode)


# -----------------------------------------------------------------------------
# Manifests: which script writes into a folder, and which files

def read_manifest(folder):
    """A folder's manifest.json as a dict, or None when it has none (a link there,
    or a file that is not a manifest, counts as none)."""
    try:
        with _open_nofollow(os.path.join(folder, _MANIFEST), os.O_RDONLY, "r") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(m, dict) and isinstance(m.get("script"), str) and isinstance(m.get("files"), list)
    return m if ok and all(_plain_name(n) for n in m["files"]) else None


def _plain_name(name):
    """A manifest lists files of its own folder only: a name, never a path (anyone can
    edit the file, and --overwrite unlinks what it lists)."""
    return isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name and \
        "/" not in name and "\\" not in name and "\0" not in name


class _Manifest:
    """A folder's manifest.json while this process writes there."""

    def __init__(self, folder, script, existing=None):
        self.folder, self.path = folder, os.path.join(folder, _MANIFEST)
        self.data = existing or dict(script=script, run=f"{os.path.basename(os.path.abspath(folder))}-"
                                     f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}", files=[])
        self.data["pid"] = os.getpid()

    def hold(self):
        """Write it and note that this process writes into the folder now."""
        write_json(self.path, self.data)
        _HELD[os.path.realpath(self.folder)] = self
        return self

    def release(self):
        _HELD.pop(os.path.realpath(self.folder), None)

    def claim(self, name):
        """List `name` before it is written; a file of that name that is not listed was
        not written here by this script, and is refused."""
        if name == _MANIFEST or name in self.data["files"]:
            return
        if os.path.lexists(os.path.join(self.folder, name)):
            raise FileExistsError(f"{os.path.join(self.folder, name)} exists and was not written by "
                                  f"{self.data['script']}; move it, or write into another folder")
        self.data["files"].append(name)
        write_json(self.path, self.data)

    def remove_files(self):
        """Unlink every listed file (a link is removed, never followed)."""
        for name in filter(_plain_name, self.data["files"]):
            path = os.path.join(self.folder, name)
            if os.path.lexists(path) and not os.path.isdir(path) or os.path.islink(path):
                os.remove(path)
        self.data["files"] = []


def _alive(pid, script=None):
    """Whether process `pid` runs (and, when `script` is given and /proc says, runs that script)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return script is None or script.encode() in f.read()
    except OSError:
        return True


def _holds_lock(pid, folder, script):
    """Whether process `pid` still writes into `folder`: it holds the folder's run.lock
    open (deleted or not; /proc says), or, where /proc cannot tell, runs `script`."""
    lock = os.path.join(os.path.realpath(folder), "run.lock")
    try:
        links = [os.readlink(os.path.join(f"/proc/{pid}/fd", fd)) for fd in os.listdir(f"/proc/{pid}/fd")]
    except FileNotFoundError:
        return False                                       # no such process
    except OSError:
        return _alive(pid, script)
    return any(link in (lock, lock + " (deleted)") for link in links)


def _remove_stale_temps(folder):
    """Remove this process's temp files and those of writers that are dead."""
    for name in os.listdir(folder):
        pid = _temp_owner(name)
        if pid is not None and (pid == os.getpid() or not _alive(pid)):
            os.remove(os.path.join(folder, name))


def _foreign_files(folder, manifest):
    """Files in `folder` that its manifest does not list (run.lock, the manifest and
    our own temp files aside)."""
    ours = set(manifest["files"]) | {_MANIFEST} if manifest else set()
    return [n for n in sorted(os.listdir(folder)) if n not in ours and n != "run.lock" and _temp_owner(n) is None]


def claim_outputs(folder, tool, names=()):
    """A folder that is not a run folder (--report, --compare) before writing into it:
    created if absent; refused if it holds a run, or a file of one of `names` that
    `tool` did not write there (its manifest says; any other name is checked when it is
    written). Returns the manifest held; call release() when done."""
    m = read_manifest(folder) if os.path.isdir(folder) else None
    if m is not None and m["script"] != tool or any(os.path.lexists(os.path.join(folder, f)) for f in _RESULT_FILES):
        raise FileExistsError(f"{folder} holds a run or another tool's output"
                              f"{' (' + m['script'] + ')' if m else ''}; write into another folder")
    listed = set(m["files"]) if m else set()
    theirs = [n for n in names if os.path.lexists(os.path.join(folder, n)) and n not in listed]
    if theirs:
        raise FileExistsError(f"{folder} already holds {', '.join(theirs)}, not written by {tool}; move "
                              f"{'them' if len(theirs) > 1 else 'it'} or write into another folder")
    os.makedirs(folder, exist_ok=True)
    return _Manifest(folder, tool, m).hold()


# -----------------------------------------------------------------------------
# Run folders: known by their manifest, locked first, never silently reused

def _check_folder_name(out_dir):
    """An --out_dir that can be written and named: not empty, and UTF-8 (its name goes
    into config.json and the messages)."""
    if not out_dir:
        raise ValueError("--out_dir is empty; give the folder to write the run into")
    try:
        out_dir.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"--out_dir={ascii(out_dir)} holds bytes that are not UTF-8; choose a folder name in "
                         f"UTF-8") from None


class RunFolder:
    """The run's out_dir: `with RunFolder(out_dir, script, overwrite, resume, reads) as folder:`. On
    entry (rank 0 only, before any data is read) it creates the folder if needed and
    takes its lock, an flock on run.lock that the kernel drops when this process ends,
    however it ends. Holding it, it accepts the folder only if it is empty or its
    manifest.json names this script (and no live writer of it); files the manifest
    does not list are never touched and refuse the folder. A run's results are
    reused only with resume or overwrite. begin(), called once every check has passed,
    writes the manifest, removes temp files of dead writers and, when overwriting, the
    files the old run's manifest lists. On exit the lock is released, and a folder this
    run created and never wrote to is removed: a refused run leaves nothing."""

    def __init__(self, out_dir, script, overwrite=False, resume=False, reads=()):
        _check_folder_name(out_dir)
        self.dir, self.script = out_dir, script
        inside = [r for r in reads if os.path.realpath(r).startswith(os.path.join(os.path.realpath(out_dir), ""))]
        if overwrite and inside:                  # --overwrite would delete what the new run reads
            raise ValueError(f"{inside[0]} lies in --out_dir={out_dir}, which --overwrite=True empties first: "
                             f"copy it out of the folder, or write into another --out_dir")
        self.overwrite, self.resume, self.created, self.lock = overwrite, resume, False, None
        self.master = int(os.environ.get("RANK", 0)) == 0   # read before the process group exists
        self.manifest = None

    def __enter__(self):
        if not self.master:
            return self
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise NotADirectoryError(f"--out_dir={self.dir} is a file, not a folder; choose another --out_dir")
        if os.path.islink(self.dir) and not os.path.exists(self.dir):
            raise FileNotFoundError(f"--out_dir={self.dir} is a link to {os.readlink(self.dir)}, which does not "
                                    f"exist; create that folder, or choose another --out_dir")
        self.created = not os.path.exists(self.dir)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._lock()
            self.manifest = self._accept()
        except BlockingIOError:
            self.__exit__()
            raise FileExistsError(f"--out_dir={self.dir} is in use by another run ({self._lock_owner()}); "
                                  f"wait for it or choose another --out_dir") from None
        except PermissionError:
            self.__exit__()
            raise PermissionError(f"--out_dir={self.dir} cannot be written; choose another --out_dir") from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def _lock(self):
        """flock run.lock (opened without following a link; BlockingIOError if another
        process holds it); retry if the file was replaced meanwhile by another run's."""
        path = os.path.join(self.dir, "run.lock")
        while True:
            f = _open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, "r+")
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                f.close()
                raise FileExistsError(f"{path} is not a regular file; remove it or choose another --out_dir")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise
            if os.path.exists(path) and os.path.samestat(os.fstat(f.fileno()), os.lstat(path)):
                break
            f.close()
        self.lock = f
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()

    def _lock_owner(self):
        """'pid N' from the folder's run.lock, for the message that it is in use."""
        try:
            with _open_nofollow(os.path.join(self.dir, "run.lock"), os.O_RDONLY | os.O_NONBLOCK, "r") as f:
                return f"pid {int(f.read(32))}"
        except (OSError, ValueError):
            return "pid unknown"

    def _accept(self):
        """The folder's manifest (None for an empty folder) once the folder is known to be
        this script's run folder, free, and of the state this call asks for."""
        m = read_manifest(self.dir)
        if m is None and os.path.lexists(os.path.join(self.dir, _MANIFEST)):
            raise FileExistsError(f"{os.path.join(self.dir, _MANIFEST)} is damaged or names a file outside its "
                                  f"folder, so nothing in --out_dir={self.dir} is touched; choose another --out_dir")
        if m is None:
            present = _foreign_files(self.dir, None)
            if present:
                raise FileExistsError(f"--out_dir={self.dir} holds files ({_some(present)}) but no {_MANIFEST}, "
                                      f"so it is not a run folder of this project's scripts; choose an empty or "
                                      f"new --out_dir")
        elif m["script"] != self.script:
            raise FileExistsError(f"--out_dir={self.dir} holds a run of another script ({m['script']}); use that "
                                  f"script, or choose another --out_dir")
        elif m.get("pid") not in (None, os.getpid()) and _holds_lock(m["pid"], self.dir, self.script):
            raise FileExistsError(f"--out_dir={self.dir} is in use by another run (pid {m['pid']}, whose run.lock "
                                  f"is gone); wait for it or choose another --out_dir")
        foreign = _foreign_files(self.dir, m)
        if foreign:
            raise FileExistsError(f"--out_dir={self.dir} holds files its run did not write ({_some(foreign)}); "
                                  f"move them, or choose an empty or new --out_dir")
        folders = [f for f in (m["files"] if m else []) if os.path.isdir(os.path.join(self.dir, f)) and
                   not os.path.islink(os.path.join(self.dir, f))]
        if folders:
            raise IsADirectoryError(f"{os.path.join(self.dir, folders[0])} is a folder where the run writes a file; "
                                    f"move it, or choose another --out_dir")
        found = [f for f in _RESULT_FILES if m and f in m["files"] and os.path.lexists(os.path.join(self.dir, f))]
        if self.resume and "ckpt.pt" not in found:
            raise FileNotFoundError(f"--init_from=resume but {os.path.join(self.dir, 'ckpt.pt')} does not exist; "
                                    f"give the folder of the run to continue with --out_dir")
        if found and not self.resume and not self.overwrite:
            raise FileExistsError(f"--out_dir={self.dir} already holds a run ({', '.join(found)}); choose another "
                                  f"--out_dir, continue it with --init_from=resume, or replace it with --overwrite=True")
        return m

    def begin(self):
        """Every check passed: write the manifest, remove dead writers' temp files and,
        with overwrite, the files the earlier run's manifest lists."""
        if self.master:
            old = self.manifest
            fresh = old is None or (self.overwrite and not self.resume)
            self.manifest = _Manifest(self.dir, self.script, None if fresh else old)
            if old is not None and fresh:
                _Manifest(self.dir, self.script, old).remove_files()
            self.manifest.hold()
            _remove_stale_temps(self.dir)
        self.created = False                               # from here on the folder is the run's
        return self

    def __exit__(self, *exc):
        if isinstance(self.manifest, _Manifest):
            self.manifest.release()
        if self.lock is not None:
            path = os.path.join(self.dir, "run.lock")
            if os.path.lexists(path) and os.path.samestat(os.fstat(self.lock.fileno()), os.lstat(path)):
                os.remove(path)                            # only the lock this process holds
            self.lock.close()                              # closing drops the flock
            self.lock = None
        if self.created and os.path.isdir(self.dir) and not os.listdir(self.dir):
            os.rmdir(self.dir)


def _some(names):
    return f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"


# -----------------------------------------------------------------------------
# Checkpoints: read weights-only and checksummed

def load_checkpoint(path, map_location="cpu"):
    """torch.load(weights_only=True), with one line naming the file when it is missing,
    empty, truncated or damaged (every zip member's CRC is checked), not a checkpoint of
    this project, or holds objects that are not tensors (loading those could run code)."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":                              # torch.save always writes a zip archive
        raise ValueError(f"checkpoint {path} is " + ("empty" if not head else "not a checkpoint of this project"))
    try:
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        state = None if damaged else torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:                                # zipfile and torch raise many kinds here
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise ValueError(f"checkpoint {path} refused: it contains objects that are not tensors, numbers or "
                             f"strings, so it was not written by this project") from None
        raise ValueError(f"checkpoint {path} is truncated or damaged ({type(e).__name__}); use an earlier "
                         f"checkpoint") from None
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged ({damaged} fails its checksum); use an earlier checkpoint")
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"checkpoint {path} is not a checkpoint of this project (no 'model' weights in it)")
    return state


def data_fingerprint(*datasets, n=256):
    """16 hex digits of sha256 over datasets: an array's shape and bytes (above 64 MiB, n
    slices of them); a dataset's size and n examples spread over it."""
    h = hashlib.sha256()
    for data in datasets:
        h.update(str(getattr(data, "shape", len(data))).encode())
        if isinstance(data, np.ndarray) and data.nbytes <= 2**26:
            h.update(data.tobytes())
            continue
        for i in np.unique(np.linspace(0, len(data) - 1, min(n, len(data))).astype(int)):
            h.update(_bytes(data[i:i + 2**16] if isinstance(data, np.ndarray) else data[int(i)]))
    return h.hexdigest()[:16]


def _bytes(x):
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return np.asarray(x).tobytes()
    return b"".join(_bytes(v) for v in x) if isinstance(x, (tuple, list)) else repr(x).encode()
