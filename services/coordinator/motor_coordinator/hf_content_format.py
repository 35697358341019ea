"""vLLM's ``--chat-template-content-format auto`` for a Hugging Face chat template (pure, no I/O):
does the template want a message's content as a string, or as a list of parts?

Same rules as ``vllm/renderers/hf.py``; tests/realengine compares it with vLLM's own function.
Needs ``jinja2`` (the ``tokenizers`` extra), imported when called.
"""

from __future__ import annotations

from typing import Any, Literal

ContentFormat = Literal["string", "openai"]


def detect_content_format(env: Any, source: str) -> ContentFormat:
    """"openai" (content passed as a list of parts) when the template loops over a message's
    content - directly, through a variable assigned from it, or through a macro parameter that
    receives it -, else "string" (parts joined by newlines). A template whose analysis fails is
    "string", as in vLLM. *env* is the jinja2 environment that parses *source*."""
    try:
        return "openai" if _loops_over_content(env.parse(source)) else "string"
    except Exception:
        return "string"


def _loops_over_content(root: Any) -> bool:
    from jinja2 import nodes

    def is_var(n: Any, name: str) -> bool:
        return isinstance(n, nodes.Name) and n.ctx == "load" and n.name == name

    def is_attr(n: Any, name: str, key: str) -> bool:
        if isinstance(n, nodes.Getitem):
            return is_var(n.node, name) and isinstance(n.arg, nodes.Const) and n.arg.value == key
        return isinstance(n, nodes.Getattr) and is_var(n.node, name) and n.attr == key

    def reaches(n: Any, name: str, key: str | None = None) -> bool:
        """*n* is the variable (or its *key*), maybe through filters, tests or a slice."""
        if isinstance(n, nodes.Filter):
            return n.node is not None and reaches(n.node, name, key)
        if isinstance(n, nodes.Test):
            return reaches(n.node, name, key)
        if isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Slice):
            return reaches(n.node, name, key)
        return is_attr(n, name, key) if key else is_var(n, name)

    def target(loop: Any) -> str:
        if not isinstance(loop.target, nodes.Name):
            raise ValueError("a loop target that is not a name")  # vLLM: analysis fails
        return str(loop.target.name)

    # names holding the messages (assigned from them, transitively), then the loop variables over them
    lists, todo = ["messages"], ["messages"]
    while todo:
        name = todo.pop(0)
        for a in root.find_all(nodes.Assign):
            if reaches(a.node, name):
                if not isinstance(a.target, nodes.Name):
                    raise ValueError("an assignment target that is not a name")
                lists.append(a.target.name)
                if a.target.name != name:
                    todo.append(a.target.name)
    items = [target(loop) for loop in root.find_all(nodes.For) if any(reaches(loop.iter, v) for v in lists)]
    # macro parameters that receive a message's content, and the loops inside macros
    params_of: dict[int, set[str]] = {}
    in_macro: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        names = [a.name for a in macro.args]
        params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(names) and any(reaches(arg, v, "content") for v in items):
                    params.add(names[i])
            for kw in call.kwargs:
                if kw.key in names and any(reaches(kw.value, v, "content") for v in items):
                    params.add(kw.key)
        for loop in macro.find_all(nodes.For):
            in_macro.add(id(loop))
            if params:
                params_of[id(loop)] = params
    for loop in root.find_all(nodes.For):
        if any(reaches(loop.iter, v, "content") for v in items):
            target(loop)
            return True
        it = loop.iter
        if isinstance(it, nodes.Name) and it.name in params_of.get(id(loop), ()):
            target(loop)
            return True
        if id(loop) not in in_macro and isinstance(it, nodes.Name) and it.name == "content":
            target(loop)
            return True
    return False
