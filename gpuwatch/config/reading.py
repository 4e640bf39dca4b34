"""Reading a config file: bounded bytes, then one YAML document composed within the bounds.

Line numbers come from composing the YAML into nodes first: each mapping key and each
sequence item records its 1-based line under its path, so a pydantic `loc` such as
`("train", "accumulation_steps")` maps back to the line of the offending key (or of the
closest parent the file has; locate.py). The loader counts values and depth as it
composes, and a document's size with its aliases expanded is checked before anything
constructs it (bounds.py has the limits). A `--set` value is read by the same loader.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.config.bounds import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_VALUES,
    MAX_NESTING_DEPTH,
    MAX_NUMBER_CHARS,
    MAX_TEXT_CHARS,
    Budget,
    LimitExceeded,
    too_deep,
)
from gpuwatch.config.errors import ConfigError
from gpuwatch.config.words import Loc, key_text, kind

_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


def read_text(path: Path, shown: str) -> str:
    try:
        raw = _read_bounded(path)
    except _TooLarge as exc:
        size = (
            f"{exc.size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}"
            if exc.size is not None
            else f"more than {MAX_CONFIG_BYTES:,} bytes"
        )
        raise ConfigError(f"{shown}: too large for a config ({size})", source=shown) from None
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file", source=shown) from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, not a config file", source=shown) from None
    except PermissionError:
        raise ConfigError(f"{shown}: permission denied", source=shown) from None
    except NotADirectoryError:
        raise ConfigError(
            f"{shown}: no such file (a parent is not a directory)", source=shown
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{shown}: cannot read ({reason})", source=shown) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        byte = raw[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"{shown}:{line}: not UTF-8 text (byte 0x{byte})", source=shown, line=line
        ) from None


class _TooLarge(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size  # None when the file has no size to ask for (a pipe, a device)


def _read_bounded(path: Path) -> bytes:
    """The file's bytes; _TooLarge past MAX_CONFIG_BYTES, without reading the rest."""
    info = path.stat()
    if stat.S_ISREG(info.st_mode):
        if info.st_size > MAX_CONFIG_BYTES:
            raise _TooLarge(info.st_size)
        raw = path.read_bytes()
        if len(raw) > MAX_CONFIG_BYTES:  # it grew since stat
            raise _TooLarge(len(raw))
        return raw
    # A pipe or a device (`<(...)`, /dev/zero) has no size: read one byte past the limit.
    with path.open("rb") as stream:
        raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise _TooLarge(None)
    return raw


def parse_yaml(
    text: str, shown: str, budget: Budget | None = None
) -> tuple[dict[Any, Any], dict[Loc, int]]:
    """Compose and construct one YAML document; returns the data and each key's line."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, budget or Budget())  # checks unprintable characters
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(
                f"{shown}: empty config (expected a mapping of settings)", source=shown
            )
        lines: dict[Loc, int] = {}
        _walk(node, (), lines, set(), set(), loader, shown)
        _check_expanded(node, loader)
        data = loader.construct_document(node)
    except LimitExceeded as exc:
        raise exc.error(shown, line=exc.line, whole="the config") from None
    except Unbuildable as exc:
        mark = exc.node.start_mark
        line = mark.line + 1
        path = _path_to(node, exc.node)
        key = f"{key_text(path)}: " if path else ""
        raise ConfigError(
            f"{shown}:{line}: {key}cannot read {_show_scalar(exc.node)} "
            f"({exc.problem})",
            source=shown,
            line=line,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        raise ConfigError(
            f"{where}: YAML syntax error: {yaml_problem(exc)}",
            source=shown,
            line=mark.line + 1 if mark else None,
        ) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise ConfigError(
            f"{shown}:{line}: YAML syntax error: unacceptable character "
            f"#x{exc.character if isinstance(exc.character, int) else ord(exc.character):04x}",
            source=shown,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{shown}: YAML syntax error: {yaml_problem(exc)}", source=shown
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        line = node.start_mark.line + 1
        raise ConfigError(
            f"{shown}:{line}: the top level must be a mapping of settings (got {kind(data)})",
            source=shown,
            line=line,
        )
    return data, lines


def load_value(text: str, budget: Budget) -> Any:
    """One YAML value (a `--set` value), bounded like a file; None for an empty document."""
    loader = _BoundedLoader(text, budget)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _walk(
    node: yaml.Node,
    path: Loc,
    lines: dict[Loc, int],
    ancestors: set[int],
    seen: set[int],
    loader: yaml.SafeLoader,
    shown: str,
) -> None:
    """Record the line of every key and item; reject duplicate keys and recursive aliases."""
    if id(node) in ancestors:
        line = lines.get(path, node.start_mark.line + 1)
        raise ConfigError(
            f"{shown}:{line}: {key_text(path)}: a YAML alias refers to a node that contains it",
            source=shown,
            line=line,
            key=key_text(path),
        )
    if id(node) in seen:  # an alias we walked already; walking it again could be exponential
        return
    seen.add(id(node))
    ancestors.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: the merged keys keep their parent's line
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a complex key; construction rejects it as unhashable
                if key_node.tag in _NUMBER_TAGS and len(key_node.value) > MAX_NUMBER_CHARS:
                    # Before constructing it: YAML 1.1's base-60 ints are quadratic to build.
                    raise ConfigError(
                        f"{shown}:{line}: {key_text(path) or '(top level)'}: a key is a number "
                        f"written with more than {MAX_NUMBER_CHARS} characters",
                        source=shown,
                        line=line,
                    )
                key = loader.construct_object(key_node, deep=True)
                child = (*path, key)
                if key in first_line:
                    raise ConfigError(
                        f"{shown}:{line}: {key_text(child)}: duplicate key "
                        f"(first at line {first_line[key]})",
                        source=shown,
                        line=line,
                        key=key_text(child),
                    )
                first_line[key] = line
                lines[child] = line
                _walk(value_node, child, lines, ancestors, seen, loader, shown)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                lines[child] = item.start_mark.line + 1
                _walk(item, child, lines, ancestors, seen, loader, shown)
    finally:
        ancestors.discard(id(node))


# What PyYAML's constructors raise, besides YAMLError, for a tagged or implicit scalar they
# cannot build: `2001-13-01` (a date), `!!int x`, `0x_`, `!!timestamp x`, `!!int` (empty).
CONSTRUCTOR_ERRORS = (ValueError, TypeError, AttributeError, OverflowError, LookupError)


def _path_to(root: yaml.Node | None, target: yaml.Node) -> tuple[Any, ...]:
    """Where target sits under root: mapping keys (their text) and list indexes."""
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    seen: set[int] = set()
    while stack:
        current, path = stack.pop()
        if current is target:
            return path
        if id(current) in seen:  # an alias repeats a node: visit it once
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            for key_node, value_node in current.value:
                stack.append((value_node, (*path, getattr(key_node, "value", "?"))))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(current.value))
    return ()


def _show_scalar(node: yaml.Node) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    tag = node.tag if isinstance(node, yaml.ScalarNode) and node.style is None else ""
    text = f"{value!r}" if len(str(value)) <= 40 else f"{str(value)[:37]!r}..."
    return f"{text} as {tag.rsplit(':', 1)[-1]}" if tag and "yaml.org" in tag else text


def yaml_problem(exc: Exception) -> str:
    if isinstance(exc, Unbuildable):
        return exc.problem
    if isinstance(exc, yaml.MarkedYAMLError):
        words = exc.problem or exc.context or "cannot parse"
        if exc.context and exc.problem and exc.context != exc.problem:
            words = f"{exc.problem} ({exc.context})"
    elif isinstance(exc, yaml.YAMLError | ValueError | OverflowError):
        words = str(exc) or type(exc).__name__
    else:  # a constructor's own bug (AttributeError on `!!timestamp x`): no words of use
        words = "cannot build this value"
    return " ".join(words.split())


class Unbuildable(Exception):
    """A scalar the YAML constructors refused, with its node (for the line and the key)."""

    def __init__(self, node: yaml.Node, problem: str) -> None:
        super().__init__(problem)
        self.node = node
        self.problem = problem


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing at the first value past the budget or the depth.

    PyYAML composes recursively until the document ends; counting as it goes makes a huge
    or deep document cost no more than the bounds, wherever in it they are broken.
    """

    def __init__(self, stream: str, budget: Budget) -> None:
        super().__init__(stream)
        self.budget = budget
        self.depth = 0
        self.aliases = 0
        # An alias in a list is the anchored node itself, marked where the anchor is:
        # (id(list node), index) -> the alias's own line, for messages.
        self.alias_lines: dict[tuple[int, int], int] = {}

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value PyYAML cannot build (`2001-13-01`, `!!int x`) is marked where it is."""
        if (isinstance(node, yaml.ScalarNode) and node.tag in _NUMBER_TAGS
                and ":" in node.value):
            # YAML 1.1's base 60: `1:20` is 80 to PyYAML, and nobody writes it meaning that.
            try:
                as_read = f", as {super().construct_object(node)}"
            except CONSTRUCTOR_ERRORS:
                as_read = ""
            raise Unbuildable(node, f"YAML 1.1 reads it in base 60{as_read}: write the number "
                              "itself, or quote it for a string")
        try:
            return super().construct_object(node, deep=deep)
        except CONSTRUCTOR_ERRORS as exc:
            raise Unbuildable(node, yaml_problem(exc)) from None

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else None
        self.budget.spend(line)
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if isinstance(parent, yaml.SequenceNode) and isinstance(index, int) and line:
                self.alias_lines[(id(parent), index)] = line
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING_DEPTH:
                raise LimitExceeded(too_deep(), line=line)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _check_expanded(root: yaml.Node, loader: _BoundedLoader) -> None:
    """LimitExceeded if the document, with its aliases expanded, breaks a bound.

    An alias repeats a node without copying it, so nine aliases of nine aliases of ...
    compose in microseconds yet expand to billions of values for anything that walks the
    data as a tree (validation, dumps). Each node's expanded size is worked out once and
    reused wherever an alias repeats it, so this costs one visit per composed node.
    """
    sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (values, depth, characters)
    open_nodes: set[int] = set()  # collections being measured: an alias to one is a loop
    expanded = " once YAML aliases are expanded" if loader.aliases else ""

    def visit(node: yaml.Node, loc: Loc, line: int, level: int) -> tuple[int, int, int]:
        size = sizes.get(id(node))
        if size is None:
            if id(node) in open_nodes:
                raise LimitExceeded(
                    "a YAML alias refers to a node that contains it", line=line, loc=loc
                )
            size = measure(node, loc, line, level)
            sizes[id(node)] = size
        if level + size[1] > MAX_NESTING_DEPTH:  # an alias puts a deep node deeper still
            raise LimitExceeded(too_deep(expanded=True), line=line, loc=loc)
        return size

    def measure(node: yaml.Node, loc: Loc, line: int, level: int) -> tuple[int, int, int]:
        if isinstance(node, yaml.ScalarNode):
            if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise LimitExceeded(
                    f"is a number written with more than {MAX_NUMBER_CHARS} characters",
                    line=line,
                    loc=loc,
                )
            return 1, 0, len(node.value)
        if level >= MAX_NESTING_DEPTH:
            raise LimitExceeded(too_deep(expanded=True), line=line, loc=loc)
        children: list[tuple[yaml.Node, Loc, int]] = []
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child_line = key_node.start_mark.line + 1
                children.append((key_node, (*loc, name), child_line))
                children.append((value_node, (*loc, name), child_line))
        else:
            for index, item in enumerate(node.value):
                item_line = loader.alias_lines.get((id(node), index), item.start_mark.line + 1)
                children.append((item, (*loc, index), item_line))
        open_nodes.add(id(node))
        values, depth, characters = 1, 1, 0
        for child, child_loc, child_line in children:
            child_values, child_depth, child_characters = visit(
                child, child_loc, child_line, level + 1
            )
            values += child_values
            depth = max(depth, child_depth + 1)
            characters += child_characters
            if values > MAX_CONFIG_VALUES:
                raise LimitExceeded(
                    f"has more than {MAX_CONFIG_VALUES:,} keys and values{expanded}",
                    line=line,
                    loc=loc,
                )
            if characters > MAX_TEXT_CHARS:
                raise LimitExceeded(
                    f"has more than {MAX_TEXT_CHARS:,} characters of text{expanded}",
                    line=line,
                    loc=loc,
                )
        open_nodes.discard(id(node))
        return values, depth, characters

    visit(root, (), root.start_mark.line + 1, 0)
