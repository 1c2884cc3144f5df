"""The trajectory viewer: one rollout τ_i as HTML, turn by turn (paper §2.1).

Each ACT output a_t is drawn in the ACT colour, each tool call under it, and then the observation
that joined the history: a REAL o_t from ``env.step`` (green, numbered by the real-call counter) or
a REHEARSED ô_t written by the policy itself (orange, "0 real calls"), or one written by a frozen
simulator (purple). Parse errors, schema violations, REHEARSE outputs without a proper
``<execution_result>`` and the stop reason are shown where they happen. Every piece of model or
environment text is HTML-escaped, and styles are inline, so the page survives notebook
sanitisers and ``nbconvert`` exports.

CSS classes name what a block is (tests and custom styles rely on them): ``envace-act``,
``envace-rehearse`` (a REHEARSE output), ``envace-obs-real``, ``envace-obs-rehearsed``,
``envace-obs-frozen_simulator``, ``envace-user``, ``envace-call``, ``envace-violation``,
``envace-parse-error``, ``envace-counter``; for a committed episode (``render_episode``) also
``envace-episode``, ``envace-rehearsal``, ``envace-attempt``, ``envace-feedback``, ``envace-memory``,
``envace-memory-message`` and ``envace-committed``.

Usage::

    from IPython.display import HTML, display
    from envace_lite.course.viewer import render_text, render_trajectory
    display(HTML(render_trajectory(trajs[0])))
    print(render_text(trajs[0]))          # the plain-text fallback
    display(HTML(render_episode(episode, row)))   # a committed run with its private rehearsal
"""
from __future__ import annotations

import html
import json
from typing import Any

COLORS = {
    "act": ("#e8f1fb", "#1f77b4"),
    "rehearse": ("#fff3e0", "#ef6c00"),
    "real": ("#e8f5e9", "#2e7d32"),
    "rehearsed": ("#fff3e0", "#ef6c00"),
    "frozen_simulator": ("#f3e5f5", "#7b1fa2"),
    "user": ("#f5f5f5", "#757575"),
    "error": ("#ffebee", "#c62828"),
}
"""(background, border) per block kind: ACT blue, REHEARSE orange, REAL green, frozen purple."""

SOURCE_LABELS = {
    "real": "REAL o_t: executed by env.step",
    "rehearsed": "REHEARSED ô_t: imagined by the policy, nothing executed",
    "frozen_simulator": "SIMULATED ô_t: imagined by the frozen initial policy, nothing executed",
}
"""The label of an observation, by ``Step.source``."""


def _esc(text: Any, max_chars: int) -> str:
    """Escape ``text`` for HTML, cut to ``max_chars`` with a note of what was cut."""
    s = str(text)
    more = ""
    if max_chars and len(s) > max_chars:
        more = f"… [{len(s) - max_chars} more characters]"
        s = s[:max_chars]
    return html.escape(s, quote=True) + html.escape(more)


def _box(kind: str, cls: str, body: str, indent: int = 0) -> str:
    bg, border = COLORS[kind]
    return (f'<div class="{cls}" style="background:{bg};border-left:4px solid {border};'
            f'margin:4px 0 4px {indent}px;padding:4px 8px;border-radius:3px">{body}</div>')


def _badge(text: str, kind: str, cls: str = "envace-badge") -> str:
    _, color = COLORS[kind]
    return (f'<span class="{cls}" style="display:inline-block;background:{color};color:#fff;'
            f'border-radius:3px;padding:0 5px;margin-right:4px;font-size:85%">'
            f'{html.escape(text)}</span>')


def _pre(text: Any, max_chars: int) -> str:
    return ('<pre style="white-space:pre-wrap;word-break:break-word;margin:2px 0;'
            f'font-size:85%;background:transparent">{_esc(text, max_chars)}</pre>')


def _args(arguments: Any) -> str:
    try:
        return json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(arguments)


def _rehearse_outputs(traj: Any, turn: int) -> list[Any]:
    return sorted((o for o in traj.outputs if o.role == "rehearse" and o.turn == turn),
                  key=lambda o: o.call_index)


def _header(traj: Any) -> str:
    task = traj.task
    reward = "not scored" if traj.reward is None else f"R = {traj.reward:.3f}"
    if not getattr(traj, "reward_valid", True):
        reward = "judge failed (masked)"
    scores = traj.reward_details.get("turn_scores") if traj.reward_details else None
    if scores:
        reward += " (per user turn: " + ", ".join(f"{s:.2f}" for s in scores) + ")"
    fields = [("task", task.id), ("suite", task.suite), ("trajectory i", traj.index),
              ("mode", traj.mode), ("grounding", traj.grounding), ("stop", traj.stop_reason),
              ("ACT turns", traj.turns), ("reward", reward)]
    body = " · ".join(f"<b>{html.escape(k)}</b>: {html.escape(str(v))}" for k, v in fields)
    kind = "real" if traj.real_calls else "rehearsed"
    counter = _badge(f"real calls: {traj.real_calls}", kind, "envace-counter")
    return f'<div class="envace-head" style="margin-bottom:6px">{counter} {body}</div>'


def render_trajectory(traj: Any, *, title: str | None = None, max_chars: int = 1500,
                      show_rehearse_raw: bool = True) -> str:
    """One trajectory as an HTML fragment, turn by turn.

    Args:
        traj: a ``types.Trajectory`` (any mode; scored or not).
        title: a heading shown above the trajectory (escaped).
        max_chars: cap per text block (user messages, ACT outputs, observations); 0 = no cap.
        show_rehearse_raw: show each REHEARSE output's raw text in a collapsed block.

    Returns:
        HTML (a ``<div class="envace-traj">``) for ``IPython.display.HTML`` or a file.
    """
    parts = [('<div class="envace-traj" style="font-family:sans-serif;font-size:13px;'
              'max-width:980px">')]
    if title:
        parts.append(f'<h4 style="margin:4px 0">{html.escape(title)}</h4>')
    parts.append(_header(traj))
    real_count = 0
    acts = [o for o in traj.outputs if o.role == "act"]
    for u in range(max(1, traj.user_turns_reached)):
        for m in traj.task.user_turns[u] if u < len(traj.task.user_turns) else []:
            body = _badge(f"USER turn {u + 1}", "user") + _pre(m.get("content", ""), max_chars)
            parts.append(_box("user", "envace-user", body))
        for o in (o for o in acts if o.user_turn == u):
            badges = _badge(f"ACT · t={o.turn}", "act", "envace-role")
            badges += _badge({"calls": "tool calls a_t", "final": "final answer",
                              "error": "PARSE ERROR"}.get(o.parse_kind, o.parse_kind),
                             "error" if o.parse_kind == "error" else "act")
            if o.error_code:
                badges += _badge(f"error code: {o.error_code}", "error", "envace-parse-error")
            if o.finish_reason == "length":
                badges += _badge("cut at max_new_tokens", "error")
            body = badges + _pre(o.text if o.text.strip() else "(empty output)", max_chars)
            parts.append(_box("error" if o.parse_kind == "error" else "act",
                              "envace-act" + (" envace-parse-error" if o.parse_kind == "error"
                                              else ""), body))
            steps = [s for s in traj.steps if s.turn == o.turn]
            rehearsals = _rehearse_outputs(traj, o.turn)
            for j, s in enumerate(steps):
                call = s.call
                line = (f'<span class="envace-call"><b>a_t</b> = '
                        f'<code>{_esc(call.name, 200)}({_esc(_args(call.arguments), 600)})</code>'
                        f'</span>')
                if call.violations:
                    items = "".join(f"<li>{_esc(v, 300)}</li>" for v in call.violations)
                    line += ('<div class="envace-violation" style="color:#c62828">schema / '
                             f'unknown-tool violations (still executed or rehearsed):<ul '
                             f'style="margin:0">{items}</ul></div>')
                parts.append(_box("error" if call.violations else "act", "envace-call-box",
                                  line, indent=24))
                if show_rehearse_raw and s.source != "real" and j < len(rehearsals):
                    r = rehearsals[j]
                    rb = _badge("REHEARSE output", "rehearse", "envace-role")
                    if r.parse_kind == "error":
                        rb += _badge(f"REHEARSE parse error: {r.error_code}; raw text used",
                                     "error", "envace-parse-error")
                    rb += _pre(r.text if r.text.strip() else "(empty output)", max_chars)
                    parts.append(_box("rehearse", "envace-rehearse", "<details><summary>"
                                      f"raw REHEARSE text (source: {html.escape(r.source)})"
                                      f"</summary>{rb}</details>", indent=24))
                obs = s.observation
                label = SOURCE_LABELS.get(s.source, s.source)
                if s.source == "real":
                    real_count += 1
                    label += f" · real call #{real_count}"
                else:
                    label += " · 0 real calls"
                ob = _badge(label, s.source if s.source in COLORS else "rehearsed")
                if obs.error:
                    ob += _badge("error observation", "error")
                if obs.state_changed:
                    ob += _badge("state changed", "real")
                ob += _pre(obs.content, max_chars)
                parts.append(_box(s.source if s.source in COLORS else "rehearsed",
                                  f"envace-obs envace-obs-{html.escape(s.source)}", ob,
                                  indent=48))
    stop = traj.stop_reason or "(still running)"
    kind = "error" if stop in ("parse_error", "context_budget", "turn_limit") else "user"
    parts.append(_box(kind, "envace-stop", _badge(f"stop: {stop}", kind)
                      + f" after {traj.turns} ACT outputs; real calls: {traj.real_calls}"))
    parts.append("</div>")
    return "\n".join(parts)


def render_text(traj: Any, max_chars: int = 300) -> str:
    """The plain-text fallback of ``render_trajectory`` (for logs and terminals).

    Args:
        traj: a ``types.Trajectory``.
        max_chars: cap per text block.
    """
    def cut(s: Any) -> str:
        s = " ".join(str(s).split())
        return s if len(s) <= max_chars else s[:max_chars] + f"… [+{len(s) - max_chars}]"

    reward = "-" if traj.reward is None else f"{traj.reward:.3f}"
    lines = [(f"task {traj.task.id} ({traj.task.suite}) i={traj.index} mode={traj.mode} "
              f"grounding={traj.grounding} stop={traj.stop_reason} R={reward} "
              f"real_calls={traj.real_calls}")]
    for u in range(max(1, traj.user_turns_reached)):
        for m in traj.task.user_turns[u] if u < len(traj.task.user_turns) else []:
            lines.append(f"[USER {u + 1}] {cut(m.get('content', ''))}")
        for o in (o for o in traj.outputs if o.role == "act" and o.user_turn == u):
            err = f" error={o.error_code}" if o.error_code else ""
            lines.append(f"  ACT t={o.turn} [{o.parse_kind}{err}] {cut(o.text)}")
            rehearsals = _rehearse_outputs(traj, o.turn)
            for j, s in enumerate(x for x in traj.steps if x.turn == o.turn):
                bad = f"  VIOLATIONS: {'; '.join(s.call.violations)}" if s.call.violations else ""
                lines.append(f"    a_t: {s.call.name}({cut(_args(s.call.arguments))}){bad}")
                r = rehearsals[j] if s.source != "real" and j < len(rehearsals) else None
                if r is not None and r.parse_kind == "error":
                    lines.append(f"    REHEARSE parse error {r.error_code}: raw text used")
                sym = "o_t" if s.source == "real" else "ô_t"
                flag = " ERROR" if s.observation.error else ""
                lines.append(f"    {sym} ({s.source}{flag}): {cut(s.observation.content)}")
    lines.append(f"stop: {traj.stop_reason} after {traj.turns} ACT outputs")
    return "\n".join(lines)


class TrajectoryView:
    """A trajectory that displays itself: HTML in notebooks, text elsewhere.

    Args:
        traj: a ``types.Trajectory``.
        **kwargs: passed to ``render_trajectory``.
    """

    def __init__(self, traj: Any, **kwargs: Any) -> None:
        self.traj, self.kwargs = traj, kwargs

    def _repr_html_(self) -> str:
        return render_trajectory(self.traj, **self.kwargs)

    def __repr__(self) -> str:
        return render_text(self.traj)


# ---------------------------------------------------------------------------------------------
# A committed episode with its private rehearsal (paper §2.3; notebook 05)
# ---------------------------------------------------------------------------------------------

def _rehearsal_block(rec: Any, max_chars: int) -> str:
    """One ``TurnRehearsal``: its N imagined attempts with their feedback f, then m_x."""
    attempts = len(rec.attempts)
    head = _badge(f"PRIVATE REHEARSAL · user turn {rec.user_turn + 1} · {rec.mode}, N={attempts}",
                  "rehearse", "envace-role")
    head += _badge(f"real calls during rehearsal: {rec.real_calls}", "rehearsed",
                   "envace-counter")
    parts = [head]
    for a in rec.attempts:
        inner = render_trajectory(a.trajectory, title=f"imagined attempt τ̃^({a.index})",
                                  max_chars=max_chars)
        fb = a.feedback
        if fb is None:
            fbody = _badge("FEEDBACK f", "rehearse") + "(not written)"
        else:
            fbody = _badge(f"FEEDBACK f^({a.index})", "rehearse")
            if not fb.ok:
                fbody += _badge(f"feedback parse error: {fb.error}", "error", "envace-parse-error")
            fbody += (f"<div><b>assessment</b>{_pre(fb.assessment or '(none)', max_chars)}</div>"
                      f"<div><b>revision</b>{_pre(fb.revision or '(none)', max_chars)}</div>")
        parts.append(_box("rehearse", "envace-attempt",
                          f"<details><summary>attempt {a.index} of {attempts}: "
                          f"{html.escape(str(a.trajectory.stop_reason))}, "
                          f"{len(a.trajectory.steps)} imagined call(s)</summary>{inner}</details>"
                          + _box("rehearse", "envace-feedback", fbody, indent=12), indent=12))
    mem = rec.memory
    if mem is not None:
        mb = _badge("MEMORY m_x", "frozen_simulator")
        flags = [f for f, on in (("empty: no memory message inserted", mem.empty),
                                 ("truncated", mem.truncated),
                                 ("no <memory> tag: visible text used", not mem.parsed)) if on]
        mb += "".join(_badge(f, "error") for f in flags)
        mb += f" {mem.tokens} tokens" + _pre(mem.text or "(empty)", max_chars)
        parts.append(_box("frozen_simulator", "envace-memory", mb, indent=12))
    return _box("rehearse", "envace-rehearsal", "\n".join(parts))


def render_episode(ep: Any, row: dict[str, Any] | None = None, *, title: str | None = None,
                   max_chars: int = 1500) -> str:
    """A committed execution (``episode.Episode``) as HTML: private rehearsal, then the real run.

    Per user turn: the user message; the turn's PRIVATE REHEARSAL (each imagined attempt τ̃^(n)
    drawn by ``render_trajectory`` in a collapsed block, its FEEDBACK f^(n), the MEMORY m_x, and
    the real-call counter of the rehearsal, which is 0); then the COMMITTED execution: each ACT
    reply and the REAL observations ``env.step`` returned, numbered by the real-call counter. The
    memory message that joined the committed history is shown where it was inserted.

    Args:
        ep: a finished or live ``episode.Episode``.
        row: its result row from ``run_committed`` (reward, stop reason), if any.
        title: a heading (escaped).
        max_chars: cap per text block; 0 = no cap.

    Returns:
        HTML (a ``<div class="envace-episode">``).
    """
    from envace_lite import protocol

    parts = [('<div class="envace-episode" style="font-family:sans-serif;font-size:13px;'
              'max-width:980px">')]
    if title:
        parts.append(f'<h4 style="margin:4px 0">{html.escape(title)}</h4>')
    real_calls = ep.env.real_calls
    reward = "not scored" if row is None else f"R = {row['reward']:.3f}"
    mode = ep.rehearsals[0].mode if ep.rehearsals else "none"
    fields = [("task", ep.task_id), ("suite", ep.suite), ("rehearsal", mode),
              ("N", len(ep.rehearsals[0].attempts) if ep.rehearsals else 0),
              ("stop", ep.stop_reason or "(live)"), ("ACT turns", ep.turns), ("reward", reward)]
    body = " · ".join(f"<b>{html.escape(k)}</b>: {_esc(v, 200)}" for k, v in fields)
    counter = _badge(f"real calls: {real_calls}", "real" if real_calls else "rehearsed",
                     "envace-counter")
    parts.append(f'<div class="envace-head" style="margin-bottom:6px">{counter} {body}</div>')
    rehearsals = {rec.user_turn: rec for rec in ep.rehearsals}
    steps = {e["history_len"]: e for e in ep.events if e["kind"] == "step"}
    memory_prefix = prompts_memory_prefix()
    user_turn, count, skip = 0, 0, set()

    def user_block(content: str) -> None:
        nonlocal user_turn
        user_turn += 1
        parts.append(_box("user", "envace-user",
                          _badge(f"USER turn {user_turn}", "user") + _pre(content, max_chars)))
        if user_turn - 1 in rehearsals:
            parts.append(_rehearsal_block(rehearsals[user_turn - 1], max_chars))
        parts.append(_box("real", "envace-committed",
                          _badge(f"COMMITTED execution · user turn {user_turn}", "real")
                          + " every call below is executed by env.step"))

    for m in ep.messages:
        if m.get("role") == "user":
            user_block(str(m.get("content", "")))
    for i, m in enumerate(ep.history):
        content = str(m.get("content", ""))
        if i in skip:
            continue
        if m["role"] == "assistant":
            parsed = protocol.parse_act(content, ep.env.tool_schemas())
            badges = _badge("ACT (committed)", "act", "envace-role")
            badges += _badge({"calls": "tool calls a_t", "final": "final answer",
                              "error": "PARSE ERROR"}.get(parsed.kind, parsed.kind),
                             "error" if parsed.kind == "error" else "act")
            parts.append(_box("error" if parsed.kind == "error" else "act", "envace-act",
                              badges + _pre(content or "(empty output)", max_chars)))
            event = steps.get(i + 1)
            if event is not None:
                skip.add(i + 1)
                for call, obs in zip(event["calls"], event["observations"]):
                    count += 1
                    line = (f'<span class="envace-call"><b>a_t</b> = <code>'
                            f'{_esc(call["name"], 200)}({_esc(_args(call["arguments"]), 600)})'
                            '</code></span>')
                    parts.append(_box("act", "envace-call-box", line, indent=24))
                    ob = _badge(f"{SOURCE_LABELS['real']} · real call #{count}", "real")
                    if obs.get("error"):
                        ob += _badge("error observation", "error")
                    if obs.get("state_changed"):
                        ob += _badge("state changed", "real")
                    parts.append(_box("real", "envace-obs envace-obs-real",
                                      ob + _pre(obs.get("content", ""), max_chars), indent=48))
        elif content.startswith(memory_prefix):
            parts.append(_box("frozen_simulator", "envace-memory-message",
                              _badge("m_x joins the committed history (user-role message)",
                                     "frozen_simulator") + _pre(content, max_chars), indent=24))
        elif content.lstrip().startswith("<tool_response>"):  # e.g. a call the write gate refused
            parts.append(_box("error", "envace-obs envace-obs-refused",
                              _badge("not executed (refused by the write gate)", "error")
                              + _pre(content, max_chars), indent=48))
        else:
            user_block(content)
    stop = ep.stop_reason or "(still running)"
    parts.append(_box("user", "envace-stop", _badge(f"stop: {stop}", "user")
                      + f" after {ep.turns} ACT outputs; real calls: {real_calls}"
                      + f"; real calls during rehearsal: {ep.rehearsal_real_calls}"))
    parts.append("</div>")
    return "\n".join(parts)


def prompts_memory_prefix() -> str:
    """The fixed start of the memory message (``prompts.MEMORY_MESSAGE``), to recognise it."""
    from envace_lite.protocol.prompts import MEMORY_MESSAGE

    return MEMORY_MESSAGE.split("{memory}")[0].split("\n")[0]


__all__ = ["COLORS", "SOURCE_LABELS", "TrajectoryView", "render_episode", "render_text",
           "render_trajectory"]
