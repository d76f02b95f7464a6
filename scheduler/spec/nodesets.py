"""Node set expressions ('gpu[01-16],login1'): their size counted from the text before anything is expanded
(`nodeset_size`), expanded within a limit (`expand_nodeset`), and folded back (`fold_nodeset`), with ClusterShell's
NodeSet. A request's node set is bounded by its size before it costs anything (docs/operations.md, Security): the
length of its text, how many names it makes and how long each name may be, so that what it expands to is at most
`limit` x MAX_NAME_CHARS characters (issue 40: `<100 kB of text>[1-10000]` made 1 GB before)."""

from __future__ import annotations

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

# The most names a node set expression may expand to (issue 26): ClusterShell makes a string per name (about 0.5 s
# and 80 MB per million) on the event loop, so the size is counted from the ranges first and a larger set refused.
MAX_NODESET = 100_000
# The longest expression read at all, in bytes (issue 40): counting its size is a pass over its text in Python (some
# 0.2 s per MiB). A cluster's whole node list folds into far less (2,000 names listed one by one take some 20 kB).
MAX_NODESET_TEXT = 64 * 1024
# The longest name an expression may make (issue 40): a node name is a host name (at most 253 characters in DNS).
MAX_NAME_CHARS = 255
_NODESET_OPS = ",!&^"  # ClusterShell's set operators between terms: union, difference, intersection, xor
_SIZE_CLAMP = 1 << 64  # sizes are counted up to here: a product of many huge ranges stays a small number


def nodeset_size(expr: str) -> int:
    """How many names `expr` expands to at most, counted from its ranges without expanding any.

    The sum over its terms (split at `,` `!` `&` `^` outside brackets) of the product of each term's bracket ranges
    (`[1-8,10-20/2]`: 8 + 6), which bounds the work ClusterShell does to expand it: set operations and repeated
    names only make the result smaller. A range that cannot be read counts 0 and an unreadable bracket 1 (the
    parser says what is wrong once the expression is known to be small).
    """
    return _measure(expr)[0]


def nodeset_name_width(expr: str) -> int:
    """How long, in characters, the longest name `expr` makes may be, counted without expanding any: per term, its
    characters outside brackets plus, for each bracket, its longest range as written (`[001-128]`: 7, at least the
    width of any number the range makes)."""
    return _measure(expr)[1]


def _measure(expr: str) -> tuple[int, int]:
    """(`nodeset_size`, `nodeset_name_width`) in one pass over the text."""
    total, term, depth = 0, 1, 0
    widest, width = 0, 0
    inner: list[str] = []
    for char in expr + ",":
        if depth:
            if char == "]":
                depth = 0
                text = "".join(inner)
                term = min(term * max(1, _ranges_size(text)), _SIZE_CLAMP)
                width += _ranges_width(text)
                inner = []
            else:
                inner.append(char)
        elif char == "[":
            depth = 1
        elif char in _NODESET_OPS:
            total = min(total + term, _SIZE_CLAMP)
            widest = max(widest, width)
            term, width = 1, 0
        else:
            width += 1
    if depth:  # an unclosed bracket: its ranges still count (ClusterShell reads the terms before it first)
        text = "".join(inner)
        total = min(total + term * max(1, _ranges_size(text)), _SIZE_CLAMP)
        widest = max(widest, width + len(text))
    return total, widest


def _ranges_width(text: str) -> int:
    """The longest range of a bracket's ranges ('1-8,10-20/2': 5), as written: no number it makes is longer."""
    return max((len(part.strip()) for part in text.split(",")), default=0)


def _ranges_size(text: str) -> int:
    """The names of a bracket's ranges ('1-8,10-20/2'), as ClusterShell's RangeSet reads them; 0 for a range it
    cannot read."""
    total = 0
    for part in text.split(","):
        base, _, step_text = part.strip().partition("/")
        try:
            step = int(step_text or "1")
            bounds = [b.strip() for b in base.split("-")]
            if len(bounds) == 1 or (len(bounds) == 2 and not bounds[0]):  # one index: 5, or -5
                int(bounds[-1])
                total += 1 if step == 1 else 0
                continue
            signs = {2: (1, 1), 3: (-1, 1), 4: (-1, -1)}.get(len(bounds))  # a-b, -a-b, -a--b
            if signs is None:
                continue
            start, stop = signs[0] * int(bounds[-3 if len(bounds) == 4 else -2]), signs[1] * int(bounds[-1])
        except ValueError:
            continue
        if step >= 1 and start <= stop:
            total = min(total + (stop - start) // step + 1, _SIZE_CLAMP)
    return total


def _shown(expr: str, limit: int = 80) -> str:
    return repr(expr if len(expr) <= limit else expr[: limit - 1] + "…")


def expand_nodeset(expr: str, *, limit: int = MAX_NODESET, text_limit: int | None = MAX_NODESET_TEXT) -> list[str]:
    """Expand a node set expression ('gpu[01-16],login1') in its written order; ValueError if invalid, or if it
    is longer than `text_limit` bytes (None: any length), may name more than `limit` nodes or make a name longer
    than MAX_NAME_CHARS (all counted before anything is expanded, see `nodeset_size`)."""
    if not isinstance(expr, str):
        raise ValueError(f"a node set expression is text, not {type(expr).__name__}")
    if text_limit is not None and len(expr) > text_limit // 4 and len(expr.encode("utf-8", "replace")) > text_limit:
        raise ValueError(
            f"node set expression {_shown(expr)} is {len(expr.encode('utf-8', 'replace')):,} bytes long, over the "
            f"limit of {text_limit:,}: fold the names into ranges, as in gpu[01-16]"
        )
    if any(c in expr for c in "@*?"):  # resolved by ClusterShell's group sources: files or commands, any size
        raise ValueError(
            f"node set expression {_shown(expr)}: node groups (@name) and wildcards (*, ?) are not supported; "
            "name the nodes, as in gpu[01-16]"
        )
    size, width = _measure(expr)
    if size > limit:
        many = "more than 10^19" if size >= _SIZE_CLAMP else f"up to {size:,}"
        raise ValueError(
            f"node set expression {_shown(expr)} names {many} nodes, over the limit of {limit:,}: name fewer nodes"
        )
    if width > MAX_NAME_CHARS:
        raise ValueError(
            f"node set expression {_shown(expr)} makes names of up to {width:,} characters, over the limit of "
            f"{MAX_NAME_CHARS}: a node name is a host name"
        )
    try:
        nodes = list(NodeSet(expr, autostep=None))
    except NodeSetParseError as exc:
        raise ValueError(f"invalid node set expression {_shown(expr)}: {exc}") from None
    if not nodes:
        raise ValueError(f"node set expression {_shown(expr)} names no node")
    return nodes


def fold_nodeset(names: list[str]) -> str:
    return str(NodeSet.fromlist(names)) if names else ""
