"""Collapsed stacks (py-spy ``--format raw``) to top-function tables and a flame graph SVG.

A raw line is ``frame;frame;...;leaf COUNT``, each frame ``function (path:line)``. Frames are
grouped by function and file (the line is dropped), paths are shortened to the package.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Profile", "load"]

_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
CUT = "[stack cut at an asyncio task step or a greenlet switch]"
_MARKERS = ("/site-packages/", "/lib/python3.11/", "/lib/python3.12/", "/lib/python3.13/")


def _short_path(path: str) -> str:
    for marker in _MARKERS:
        if marker in path:
            return path.split(marker, 1)[1]
    for top in ("/service/", "/bench/", "/tests/"):
        if top in path:
            return top.strip("/") + "/" + path.split(top, 1)[1]
    return path


def _frame(raw: str) -> str:
    match = _FRAME.match(raw.strip())
    if match is None:
        return raw.strip()
    return f"{match['func']} ({_short_path(match['path'])})"


def _package(frame: str) -> str:
    """The top-level package (or stdlib module) a frame's file belongs to."""
    match = re.search(r"\(([^()]*)\)$", frame)
    path = match.group(1) if match else frame
    head = path.split("/", 1)[0]
    return head.removesuffix(".py") or path


@dataclass
class _Node:
    count: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


@dataclass
class Profile:
    stacks: list[tuple[tuple[str, ...], int]]

    @property
    def total(self) -> int:
        return sum(count for _, count in self.stacks)

    def self_time(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for frames, count in self.stacks:
            if frames:
                counts[frames[-1]] += count
        return counts

    def inclusive(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for frames, count in self.stacks:
            for frame in set(frames):
                counts[frame] += count
        return counts

    def by_package(self) -> Counter[str]:
        """Self time grouped by the package of the leaf frame."""
        counts: Counter[str] = Counter()
        for frames, count in self.stacks:
            if frames:
                counts[_package(frames[-1])] += count
        return counts

    def matching(self, needle: str) -> int:
        """Samples with a frame containing ``needle`` anywhere on the stack."""
        return sum(count for frames, count in self.stacks if any(needle in f for f in frames))

    def report(self, title: str, top: int = 25) -> str:
        total = self.total or 1
        inclusive = self.inclusive()
        own: Counter[str] = Counter(
            {name: n for name, n in inclusive.items() if "(service/" in name}
        )
        logging_samples = self.matching("(logging/")
        lines = [
            f"{title}: {self.total} samples (the worker's CPU-busy samples)",
            "Stacks are cut where asyncio's C task step or SQLAlchemy's greenlet switch "
            "starts them, so outer frames are undercounted in the inclusive lists.",
            f"samples with logging on the stack: {logging_samples} "
            f"({100 * logging_samples / total:.1f}%)",
            "",
        ]
        for heading, counts in (
            ("self time by package (leaf frame)", self.by_package()),
            ("top functions, self time", self.self_time()),
            ("top functions of service/, inclusive", own),
            ("top functions, inclusive (on the stack)", inclusive),
        ):
            lines.append(heading)
            for name, count in counts.most_common(top):
                lines.append(f"  {100 * count / total:6.2f}%  {count:>7}  {name}")
            lines.append("")
        return "\n".join(lines)

    # -- SVG -------------------------------------------------------------------------------

    def svg(self, title: str, width: int = 1400) -> str:
        root = _Node()
        for frames, count in self.stacks:
            root.count += count
            node = root
            if frames and not frames[0].startswith("<module>"):
                # a stack cut at a task step or greenlet switch: grouped under one parent
                frames = (CUT, *frames)
            for frame in frames:
                node = node.children.setdefault(frame, _Node())
                node.count += count
        row, pad, top = 17, 10, 44
        scale = (width - 2 * pad) / (root.count or 1)
        boxes: list[tuple[int, float, float, str, int]] = []  # depth, x, width, name, count

        def place(node: _Node, name: str, x: float, depth: int) -> None:
            w = node.count * scale
            if w < 0.4:
                return
            boxes.append((depth, x, w, name, node.count))
            for child_name, child in sorted(node.children.items()):
                place(child, child_name, x, depth + 1)
                x += child.count * scale

        place(root, "all", pad, 0)
        depth_max = max((b[0] for b in boxes), default=0)
        height = top + (depth_max + 1) * row + pad
        rects = []
        for depth, x, w, name, count in boxes:
            y = height - pad - (depth + 1) * row  # the root at the bottom
            pct = 100 * count / (root.count or 1)
            label = html.escape(name)
            text = (
                f'<text x="{x + 3:.1f}" y="{y + row - 5}">{html.escape(_fit(name, w))}</text>'
                if w > 30
                else ""
            )
            rects.append(
                f"<g><title>{label} ({count} samples, {pct:.2f}%)</title>"
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
                f'fill="{_color(name)}" rx="2"/>{text}</g>'
            )
        body = "\n".join(rects)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="monospace" font-size="11">\n'
            f'<rect width="100%" height="100%" fill="#fdfdf6"/>\n'
            f'<text x="{pad}" y="24" font-size="15">{html.escape(title)}</text>\n'
            f'<text x="{pad}" y="38" fill="#555">{self.total} samples; hover a frame for '
            f"its share</text>\n{body}\n</svg>\n"
        )


def _fit(name: str, width: float) -> str:
    chars = int(width / 6.7)
    return name if len(name) <= chars else name[: max(0, chars - 2)] + ".."


def _color(name: str) -> str:
    digest = hashlib.md5(_package(name).encode(), usedforsecurity=False).digest()
    return f"rgb({205 + digest[0] % 50},{80 + digest[1] % 130},{40 + digest[2] % 50})"


def load(path: Path) -> Profile:
    stacks: list[tuple[tuple[str, ...], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks.append((tuple(_frame(f) for f in stack.split(";")), int(count)))
    return Profile(stacks)
