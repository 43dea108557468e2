"""Render a Jinja expression as Ansible did before it moved into a filter plugin, to pin the filter to it.

`expr(text, **names)` evaluates one expression (what stood between ``{{`` and ``}}``) and
`render(template, **names)` a whole template, in a plain Jinja environment with Ansible's own
filters and tests (ansible.builtin's core and mathstuff filters, core and files tests) and undefined names raising, as
Ansible's templating does. Used by the tests of the filters that replaced inline ternaries.
"""

from __future__ import annotations

from typing import Any

import jinja2
from ansible.plugins.filter.core import FilterModule as _CoreFilters
from ansible.plugins.filter.mathstuff import FilterModule as _MathFilters
from ansible.plugins.test.core import TestModule as _CoreTests
from ansible.plugins.test.files import TestModule as _FileTests

# Text as Ansible renders it: no HTML autoescaping.
_ENV = jinja2.Environment(  # noqa: S701
    undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
# Ansible's own `default` (and its `d` alias) reads Ansible's undefined markers; Jinja's does the
# same for a plain Jinja undefined.
_ENV.filters.update({k: v for k, v in _CoreFilters().filters().items() if k not in ("default", "d")})
_ENV.filters.update(_MathFilters().filters())
_ENV.tests.update(_CoreTests().tests())
_ENV.tests.update(_FileTests().tests())


def expr(text: str, filters: dict[str, Any] | None = None, **names: Any) -> Any:
    """The value of one Jinja expression (native, not rendered to text); `filters` adds the project's."""
    env = _ENV
    if filters:
        env = _ENV.overlay()
        env.filters.update(filters)
    return env.compile_expression(text, undefined_to_none=False)(**names)


def render(template: str, **names: Any) -> str:
    """A template rendered to text."""
    return _ENV.from_string(template).render(**names)
