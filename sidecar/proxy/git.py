"""git's smart HTTP push, read and written without a repository: a sans-io codec.

A ``git push`` over HTTP is one ``POST .../git-receive-pack`` whose body is pkt-lines of
ref updates (``OLD NEW REF``, capabilities after a NUL on the first) followed by a pack.
What makes two pushes "the same effect" is not the commit id - a resumed agent that
re-creates the same change gets a new sha, since commit timestamps differ - but the same
ref moved to a commit with the same tree on the same parents.  So we read the pushed
commits out of the pack (dulwich parses it; deltas inside the pack are resolved) and
fingerprint ``(ref, tree, parents)``.

The answer git expects is a report-status (``unpack ok`` then ``ok REF`` / ``ng REF
why``), inside side-band channel 1 if the client asked for side-band; channel 2 carries
messages git prints as ``remote: ...``.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, field

ZERO_SHA = "0" * 40
_SHA = re.compile(r"[0-9a-f]{40}")
_COMMIT = 1
_OFS_DELTA = 6
_REF_DELTA = 7


class GitProtocolError(ValueError):
    """The body is not a well-formed receive-pack request."""


@dataclass(frozen=True, slots=True)
class RefUpdate:
    old: str
    new: str
    ref: str

    @property
    def is_delete(self) -> bool:
        return self.new == ZERO_SHA


@dataclass(frozen=True, slots=True)
class PushedCommit:
    tree: str
    parents: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Push:
    updates: tuple[RefUpdate, ...]
    capabilities: frozenset[str]
    commits: dict[str, PushedCommit] = field(default_factory=dict)

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(u.ref for u in self.updates)

    def fingerprint(self) -> str:
        """sha256 over each update's ref and the tree and parents it points the ref at."""
        parts: list[list[object]] = []
        for update in sorted(self.updates, key=lambda u: u.ref):
            if update.is_delete:
                parts.append([update.ref, "delete"])
            elif (commit := self.commits.get(update.new)) is not None:
                parts.append([update.ref, commit.tree, list(commit.parents)])
            else:
                # The pack did not carry the commit (pushing one the remote already has):
                # only its id can tell pushes apart.
                parts.append([update.ref, "commit", update.new])
        return "sha256:" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def summary(self) -> dict[str, object]:
        """What the effect log keeps of the push (no pack bytes)."""
        return {
            "updates": [
                {
                    "ref": u.ref,
                    "old": u.old,
                    "new": u.new,
                    "tree": c.tree if (c := self.commits.get(u.new)) else None,
                    "parents": list(c.parents) if c else None,
                }
                for u in self.updates
            ]
        }


# ---- pkt-lines ---------------------------------------------------------------------------


def pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


FLUSH = b"0000"


def read_pkt_lines(data: bytes, start: int = 0) -> tuple[list[bytes | None], int]:
    """pkt-lines from ``start`` up to and including the first flush (None) -> (lines, end)."""
    lines: list[bytes | None] = []
    at = start
    while at + 4 <= len(data):
        try:
            length = int(data[at : at + 4], 16)
        except ValueError as error:
            raise GitProtocolError(f"bad pkt-line length at byte {at}") from error
        if length == 0:
            lines.append(None)
            return lines, at + 4
        if length < 4 or at + length > len(data):
            raise GitProtocolError(f"pkt-line at byte {at} runs past the end")
        lines.append(data[at + 4 : at + length])
        at += length
    raise GitProtocolError("no flush-pkt: the command list is truncated")


def parse_receive_pack(body: bytes) -> Push:
    """Read a receive-pack request body: ref updates, capabilities and pushed commits."""
    lines, end = read_pkt_lines(body)
    updates: list[RefUpdate] = []
    capabilities: frozenset[str] = frozenset()
    for index, line in enumerate(lines):
        if line is None:
            break
        text = line.rstrip(b"\n")
        if index == 0 and b"\0" in text:
            text, _, caps = text.partition(b"\0")
            capabilities = frozenset(caps.decode(errors="replace").split())
        if text.startswith(b"shallow "):
            continue
        parts = text.decode(errors="replace").split(" ")
        if len(parts) != 3 or not (_SHA.fullmatch(parts[0]) and _SHA.fullmatch(parts[1])):
            raise GitProtocolError(f"not a ref update: {text[:100]!r}")
        updates.append(RefUpdate(parts[0], parts[1], parts[2]))
    if not updates:
        raise GitProtocolError("the push updates no ref")
    if "push-options" in capabilities:
        _, end = read_pkt_lines(body, end)
    pack = body[end:]
    commits = _pushed_commits(pack) if pack.startswith(b"PACK") else {}
    return Push(tuple(updates), capabilities, commits)


def _pushed_commits(pack: bytes) -> dict[str, PushedCommit]:
    """Every commit in the pack whose content can be reconstructed from the pack alone.

    A pushed pack is usually thin: trees and blobs may be deltas against objects only the
    remote has.  Commits we need are almost always whole or deltas within the pack; one
    that is not is left out (its push is then fingerprinted by commit id).
    """
    from dulwich.objects import Commit  # noqa: PLC0415 - only for a git push
    from dulwich.pack import PackStreamReader, apply_delta  # noqa: PLC0415

    stream = io.BytesIO(pack)
    try:
        reader = PackStreamReader(hashlib.sha1, read_all=stream.read)
        entries = list(reader.read_objects())
    except Exception as error:
        # dulwich reports truncated or corrupt packs through many exception types
        # (struct.error, zlib.error, ChecksumMismatch, AssertionError, ...).
        raise GitProtocolError(f"unreadable pack: {type(error).__name__}: {error}") from error
    by_offset = {e.offset: e for e in entries}
    resolved: dict[int, tuple[int, bytes]] = {}

    def resolve(offset: int, depth: int = 0) -> tuple[int, bytes] | None:
        if offset in resolved:
            return resolved[offset]
        entry = by_offset.get(offset)
        if entry is None or depth > 50:
            return None
        raw = b"".join(entry.decomp_chunks)
        if entry.pack_type_num == _OFS_DELTA:
            assert isinstance(entry.delta_base, int)
            base = resolve(offset - entry.delta_base, depth + 1)
            if base is None:
                return None
            result = (base[0], b"".join(apply_delta(base[1], raw)))
        elif entry.pack_type_num == _REF_DELTA:
            return None  # base outside the pack (thin pack): not needed for commits
        else:
            result = (entry.pack_type_num, raw)
        resolved[offset] = result
        return result

    commits: dict[str, PushedCommit] = {}
    for entry in entries:
        found = None if entry.offset is None else resolve(entry.offset)
        if found is None or found[0] != _COMMIT:
            continue
        commit = Commit.from_string(found[1])
        commits[commit.id.decode()] = PushedCommit(
            commit.tree.decode(), tuple(p.decode() for p in commit.parents)
        )
    return commits


# ---- report-status -----------------------------------------------------------------------


def report_status(push: Push, rejected: dict[str, str] | None = None, message: str = "") -> bytes:
    """The receive-pack answer git expects for ``push``: every ref ok but ``rejected``.

    Shaped by the client's own capabilities (side-band or not), so it is valid whatever
    git version sent the push, including one other than the push first recorded.
    """
    rejected = rejected or {}
    report = pkt(b"unpack ok\n")
    for update in push.updates:
        why = rejected.get(update.ref)
        line = f"ok {update.ref}\n" if why is None else f"ng {update.ref} {why}\n"
        report += pkt(line.encode())
    report += FLUSH
    band = "side-band-64k" in push.capabilities or "side-band" in push.capabilities
    if not band:
        return report
    limit = 65515 if "side-band-64k" in push.capabilities else 995
    out = b""
    if message:
        for text in message.splitlines():
            out += pkt(b"\x02" + f"{text}\n".encode())
    for at in range(0, len(report), limit):
        out += pkt(b"\x01" + report[at : at + limit])
    return out + FLUSH


def read_report(body: bytes) -> dict[str, str | None] | None:
    """Parse a receive-pack answer: ``{ref: None if ok else why}``; None if unreadable."""
    try:
        lines, _ = read_pkt_lines(body)
    except GitProtocolError:
        return None
    if lines and lines[0] is not None and lines[0][:1] in (b"\x01", b"\x02", b"\x03"):
        channel = b"".join(line[1:] for line in lines if line is not None and line[:1] == b"\x01")
        return read_report(channel)
    results: dict[str, str | None] = {}
    unpacked = False
    for line in lines:
        if line is None:
            break
        text = line.decode(errors="replace").rstrip("\n")
        if text.startswith("unpack "):
            unpacked = text == "unpack ok"
        elif text.startswith("ok "):
            results[text[3:]] = None
        elif text.startswith("ng "):
            ref, _, why = text[3:].partition(" ")
            results[ref] = why or "rejected"
    if not unpacked:
        return {ref: "unpack failed" for ref in results} or None
    return results


def advertised_refs(body: bytes) -> dict[str, str]:
    """Refs from an ``info/refs?service=git-upload-pack`` answer (protocol v0/v1)."""
    refs: dict[str, str] = {}
    at = 0
    while at < len(body):
        lines, at = read_pkt_lines(body, at)
        for line in lines:
            if line is None or line.startswith(b"#"):
                continue
            text = line.split(b"\0", 1)[0].decode(errors="replace").rstrip("\n")
            sha, _, ref = text.partition(" ")
            if len(sha) == 40 and ref:
                refs[ref] = sha
    return refs
