"""The plain validator's ACL files and their watcher: plainAclFile and every .yml/.yaml under the
acl dir, polled (read and compared) every `poll_interval` seconds, so an in-place rewrite and a
replacement by rename are both seen; a file that does not load keeps the last good rules and logs
why, with the line."""
from __future__ import annotations

import logging
import os
import threading

from .loader import build_file
from .permissions import AclFile, AclFileError, AclRules, merge_rules

log = logging.getLogger("rmq.acl")


class AclFileWatcher:
    """The ACL files' current rules (`rules`, replaced whole on a change) and the thread that
    watches the files."""

    def __init__(self, acl_file: str, acl_dir: str | None, poll_interval: float):
        self.path = os.path.abspath(acl_file)  # plainAclFile: new accounts and white addresses go here
        self.acl_dir = os.path.abspath(acl_dir) if acl_dir else None  # its .yml/.yaml files, read too
        self.poll_interval = poll_interval
        self._reloading = threading.Lock()  # the watcher's and an admin command's reloads, one at a time
        self._generation = 0
        self._paths: list[str] = []  # the ACL files found by the last look
        self._files: dict[str, AclFile] = {}  # path -> its last good rules
        self._texts: dict[str, str | None] = {}  # path -> the text last taken (loaded, or logged as bad)
        self._seen: dict[str, str] = {}  # path -> the watcher's last read of a changed file, not taken yet
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
            log.warning("ACL: %s did not exist; created it empty: every request is refused until an ACL file "
                        "names accounts or globalWhiteRemoteAddresses", self.path)
        self.rules: AclRules = self._load(strict=True)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="rmq-acl-watch", daemon=True)
        self._watcher.start()

    def acl_files(self) -> list[str]:
        """The ACL files read (PlainPermissionManager.getAllAclFiles): plainAclFile, then every .yml
        or .yaml under the acl dir ($ROCKETMQ_HOME/conf/acl), sub-directories included, by path."""
        found = []
        if self.acl_dir and os.path.isdir(self.acl_dir):
            for root, dirs, names in os.walk(self.acl_dir):
                dirs.sort()
                found.extend(os.path.join(root, n) for n in sorted(names) if n.endswith((".yml", ".yaml")))
        return [self.path] + [f for f in found if f != self.path]

    def reload(self) -> bool:
        """Re-read the files when one changed, appeared or went: True when new rules took effect."""
        with self._reloading:
            return self._reload()

    def _load(self, strict: bool = False, settle: bool = False) -> AclRules | None:
        """The rules of the files as they are now, or None when nothing changed.  A file that does
        not load keeps its last good rules and is logged once per content (strict, at start: raised);
        with `settle` a changed text is taken once two polls read the same one (a file rewritten in
        place may be read half written, even empty)."""
        paths = self.acl_files()
        # (a file gone takes its accounts with it; a new one counts once it loads)
        changed, self._paths = bool(set(self._paths) - set(paths)), paths
        files = {}
        for path in paths:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                if strict:
                    raise AclFileError(f"cannot read the ACL file {path}: {e.strerror}") from None
                if self._texts.get(path, "") is not None:
                    log.error("ACL: cannot read %s (%s); keeping the last good rules", path, e.strerror)
                    self._texts[path] = None  # logged once; tried again on the next poll
                text = None
            if text is not None and text != self._texts.get(path):
                if settle and text != self._seen.get(path):
                    self._seen[path] = text
                else:
                    self._texts[path] = text
                    try:
                        files[path] = build_file(path, text)
                        changed = True
                        continue
                    except AclFileError as e:
                        if strict:
                            raise
                        log.error("ACL: %s; keeping the last good rules", e)
            if path in self._files:
                files[path] = self._files[path]
        if not changed:
            return None
        self._files = files
        try:
            rules = merge_rules([files[p] for p in paths if p in files], self._generation + 1)
        except AclFileError as e:
            if strict:
                raise
            log.error("ACL: %s; keeping the last good rules", e)
            return None
        self._generation += 1
        return rules

    def _reload(self, settle: bool = False) -> bool:
        rules = self._load(settle=settle)
        if rules is None:
            return False
        self.rules = rules
        log.info("ACL: reloaded %s (%d accounts, %d global white addresses)", ", ".join(f.path for f in rules.files),
                 len(rules.accounts), len(rules.global_white))
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                with self._reloading:
                    self._reload(settle=True)
            except Exception:
                log.exception("ACL: watching %s failed", self.path)

    def close(self) -> None:
        self._stop.set()
        if self._watcher.is_alive() and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
