#!/usr/bin/python
# hicache-fleet: the rollout's router membership in one call (roles/rollout_router check, leave,
# join). Runs where rollout_router_delegate_to says (the controller by default): standard
# library only. The logic is in module_utils/fleet_router.py (tested in tests/router).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_router
short_description: List an sglang-router's workers, take a host's instances out of its rotation or put them in
description:
  - >-
    O(state=read) lists the router's workers (C(GET /workers)) and fails, saying what to check, when the
    router does not answer with them.
  - >-
    O(state=out) lists the workers, removes each one whose URL is a leaving instance's
    (C(DELETE /workers/{id}), the id the router supplied percent-encoded whole), polls C(GET /workers)
    until the router no longer lists them, then waits O(drain_grace_s) for their requests in flight.
  - >-
    O(state=in) lists the workers, adds each instance the router does not list (C(POST /workers) with
    C({"url": ...})) and polls until it lists every named instance as healthy. An instance already
    listed is left alone; when none is missing, nothing changes.
  - >-
    Only a 200 whose JSON is an object with a list in C(workers) is an answer: a 5xx, a redirect or
    anything else is never taken for gone nor healthy. No redirect is followed (the key would go
    along); an answer of more than 4 MiB is refused; every request ends at its own deadline
    (O(timeout)) and the polls share one (O(wait_s)), however slowly the router answers. The router's
    text reaches a message only stripped of control characters and cut short; the key never does.
  - >-
    A worker's URL is C(<worker_scheme>://<worker_host>:<port>) for each instance of O(ports).
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  url:
    description:
      - The router's base URL, C(http(s)://HOST:PORT) without C(user:password@) (C(rollout_router_url)).
    type: str
    required: true
  api_key:
    description:
      - The router's control-plane key (C(rollout_router_api_key)), sent as C(Authorization) C(Bearer).
      - Refused, without showing it, when it holds whitespace or a character that is not printable ASCII.
    type: str
    default: ""
  state:
    description:
      - C(read) lists the workers; C(out) takes the named instances out; C(in) puts them in.
    type: str
    default: read
    choices: [read, out, in]
  ports:
    description:
      - This host's instances, name to port (C(sglang_service_deployed)); their worker URLs are returned as RV(urls).
    type: dict
    default: {}
  names:
    description:
      - The instances O(state=out) takes out or O(state=in) puts in (C(rollout_router_leaving)).
      - Default every one of O(ports).
    type: list
    elements: str
  worker_scheme:
    description: Scheme of the worker URLs (C(rollout_router_worker_scheme)).
    type: str
    default: http
    choices: [http, https]
  worker_host:
    description:
      - Host part of the worker URLs (C(rollout_router_worker_host)); an IPv6 literal is put in brackets.
      - Required when O(ports) is not empty.
    type: str
    default: ""
  wait_s:
    description:
      - Seconds at most for all polls together until the router lists the change (C(rollout_router_wait_s)).
    type: int
    default: 120
  drain_grace_s:
    description:
      - O(state=out) only, seconds for in-flight requests to finish once the router dropped the instances
        (C(rollout_router_drain_grace_s)).
    type: int
    default: 10
  poll_interval:
    description: Seconds between two polls.
    type: float
    default: 1.0
  timeout:
    description: Seconds one request may take at most, its whole answer included.
    type: float
    default: 30.0
  validate_certs:
    description: Verify the router's TLS certificate (C(rollout_router_validate_certs)).
    type: bool
    default: true
attributes:
  check_mode:
    description: >-
      Lists the workers (a read) and says what it would change; sends no DELETE or POST and waits for
      nothing.
    support: full
  diff_mode:
    description: Nothing to show.
    support: none
  platform:
    description: Any host that reaches the router (C(rollout_router_delegate_to)).
    support: full
    platforms: posix
notes:
  - Needs only the Python standard library.
"""

EXAMPLES = r"""
- name: Router | take the restarting instances out
  fleet_router:
    url: "{{ rollout_router_url }}"
    api_key: "{{ rollout_router_api_key }}"
    state: out
    ports: "{{ sglang_service_deployed | items2dict(key_name='name', value_name='port') }}"
    names: "{{ rollout_router_leaving }}"
    worker_host: "{{ rollout_router_worker_host }}"
    wait_s: "{{ rollout_router_wait_s }}"
    drain_grace_s: "{{ rollout_router_drain_grace_s }}"
  delegate_to: "{{ rollout_router_delegate_to }}"
  become: false
  register: _rollout_router
"""

RETURN = r"""
changed:
  description: Whether the router's rotation changed (in check mode, whether it would).
  returned: always
  type: bool
events:
  description: >-
    What changed, one line per worker URL, e.g. C(left http://10.0.0.2:30004), C(joined ...),
    C(would leave ...).
  returned: always
  type: list
  elements: str
removed:
  description: The names of the instances O(state=out) took out (empty in check mode).
  returned: always
  type: list
  elements: str
added:
  description: The names of the instances O(state=in) added (empty in check mode).
  returned: always
  type: list
  elements: str
workers:
  description: The router's workers as its first C(GET /workers) listed them (id, url, is_healthy, ...).
  returned: when the router answered
  type: list
  elements: dict
urls:
  description: This host's worker URLs, instance name to URL.
  returned: always
  type: dict
status:
  description: The HTTP status of the router's last answer (null when it gave none).
  returned: always
  type: int
msg:
  description: One line saying what was done, or why it failed.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_router import ARGUMENT_SPEC, RouterError, check_params, run


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    errors = check_params(p)
    if errors:
        module.fail_json(msg=" ".join(errors), changed=False, events=[], removed=[], added=[], urls={}, status=None)
    try:
        result = run(p, check_mode=module.check_mode)
    except RouterError as exc:
        failed = {"changed": False, "events": [], "removed": [], "added": [], "urls": {}, "status": None}
        failed.update(exc.result)
        failed.pop("msg", None)
        module.fail_json(msg=str(exc), **failed)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
