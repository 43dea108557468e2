#!/usr/bin/python
# hicache-fleet: warm an SGLang server with the operator's prompts before it rejoins the router.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_warm_set
short_description: Send an operator's warm set to an SGLang server once, before it rejoins the router
description:
  - >-
    Issue 27 item 3: a host that passed its gate is warmed before it goes back into the router. Each
    file of O(files) is one prompt, sent once through the native C(/generate) API (streamed,
    O(max_new_tokens) output tokens, temperature 0), so its prefix is in the server's cache when the
    router sends traffic again.
  - >-
    Returns per file its prompt tokens, the cached tokens of that send by tier (device, host, storage,
    as C(meta_info.cached_tokens_details) reports them), TTFT and ok or the error; and the totals: warm
    tokens (prompt tokens of the sends that succeeded) and seconds.
  - >-
    A request that fails does not fail the task (a warm-up that fails must not fail the host): the
    result lists the file with its error, C(warnings) says it, and C(failed) is false. Only bad options
    fail it, before anything is sent: a file that cannot be read or parsed, O(max_new_tokens) below 1,
    a timeout not above 0, a bad O(url).
  - C(changed) is false, as filling a cache is not a change the operator has to act on.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the SGLang server.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: Sent as C(Authorization) C(Bearer) header when the server runs with C(--api-key).
    type: str
  files:
    description:
      - Paths on the managed host, one prompt each, sent in this order.
      - >-
        A file named C(*.json) holds token ids: a list of whole numbers, or C({"input_ids": [...]}).
        Any other file is the prompt as UTF-8 text (sent as C(text); the server tokenizes it).
    type: list
    elements: path
    required: true
  max_new_tokens:
    description: Output tokens of each warm request.
    type: int
    default: 1
  request_timeout:
    description: Seconds one warm request may take.
    type: float
    default: 900
  total_timeout:
    description:
      - >-
        Seconds the whole warm set may take; each request gets at most what is left, and files not sent
        when it ran out are reported (not sent), not failed.
    type: float
    default: 3600
attributes:
  check_mode:
    description: Reads and checks the files, sends nothing and returns the plan.
    support: full
  diff_mode:
    description: Nothing to show.
    support: none
  platform:
    description: Any host whose Python reaches the server's URL.
    support: full
    platforms: posix
notes:
  - Needs only the Python standard library on the managed host.
"""

EXAMPLES = r"""
- name: Warm the host with the operator's warm set before it rejoins the router
  sglang_warm_set:
    url: "http://127.0.0.1:{{ sglang_service_port }}"
    api_key: "{{ sglang_service_api_key | default(omit) }}"
    files:
      - /var/lib/hicache-fleet/warm/system-prompt.txt
      - /var/lib/hicache-fleet/warm/agent-prefix.json
  register: warmed
"""

RETURN = r"""
msg:
  description: "One line, e.g. C(warmed 2 of 2 files: 41000 tokens (0 already cached) in 12.5 s)."
  returned: always
  type: str
plan:
  description: Per file its kind (text or input_ids), size and the request it is (also in check mode).
  returned: always
  type: list
files:
  description: >-
    Per file: file, ok, error (None when ok), tokens (prompt tokens), cached_tokens,
    device_cached_tokens, host_cached_tokens, storage_cached_tokens, ttft_ms.
  returned: when not in check mode
  type: list
sent:
  description: Requests sent (files skipped when total_timeout ran out are not counted).
  returned: when not in check mode
  type: int
ok:
  description: Files warmed.
  returned: when not in check mode
  type: int
failed_files:
  description: Files that were not warmed (their error is in files and warnings).
  returned: when not in check mode
  type: list
warm_tokens:
  description: Prompt tokens of the files warmed.
  returned: when not in check mode
  type: int
cached_tokens:
  description: Of those, tokens the server already had cached.
  returned: when not in check mode
  type: int
seconds:
  description: How long warming took.
  returned: when not in check mode
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_probe_client import ProbeError, SGLangClient
from ansible.module_utils.sglang_warm_set import (
    ARGUMENT_SPEC,
    load_prompts,
    send_warm_set,
    validate_params,
    warm_plan,
    warm_summary,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    errors = validate_params(p)
    if errors:
        module.fail_json(msg="invalid options: " + " ".join(errors))
    failure = None
    try:
        SGLangClient(p["url"], p.get("api_key"), p["request_timeout"])  # url and api_key checked, nothing sent
        prompts = load_prompts(p["files"])
    except ProbeError as exc:
        failure = str(exc)
    if failure:
        module.fail_json(msg=failure)
    plan = warm_plan(prompts, p)
    if module.check_mode:
        module.exit_json(changed=False, plan=plan, sent=0,
                         msg=f"check mode: would send {len(plan)} warm prompts to {p['url']}; nothing sent")
    result = send_warm_set(p, prompts)
    warnings = result.pop("warnings")
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, plan=plan, msg=warm_summary(result), **result)


if __name__ == "__main__":
    main()
