"""Notebook 04 in words: each sentence reads its numbers from the tables (`cllm_tables`), never
from typed text."""

from __future__ import annotations

from specdec_lab import words
from specdec_lab.experiments import lineups
from specdec_lab.experiments.cllm_tables import (FORWARD_COST_TOLERANCE, TRAINED_ON, Tables, accuracy_names, cllm_pick,
                                                 jacobi_numbers, learning_trend)
from specdec_lab.metrics import Speedup


def cost_findings(tables: Tables, params: dict) -> str:
    be = tables.break_even
    own = be[be.model == f"{params['model']} ({params['dtype']})"].set_index("method").break_even_tokens_per_forward
    jacobi = f"Jacobi, block of {params['block_size']}"
    pick = cllm_pick(be)
    text = (f"A Jacobi iteration over a block of {params['block_size']} costs **{own[jacobi]:.2f}x** an AR step of "
            f"{params['model']} ({params['dtype']}) here, so Jacobi decoding or a CLLM on it needs more than "
            f"{own[jacobi]:.2f} tokens per forward to beat AR. ")
    if pick is None:
        return text + "No measured model has a Jacobi block that breaks even at 1.5 tokens per forward or less."
    text += (f"The cost curves favour **{pick.model}** with blocks of **{pick.tokens_per_pass}** for a CLLM: there a "
             f"block breaks even at {pick.break_even_tokens_per_forward:.2f} tokens per forward, the largest block "
             f"within the 1.5 tokens per forward a CLLM should reach. ")
    if pick.model == f"{params['model']} ({params['dtype']})":
        return text + "This profile trains that model."
    return text + (f"This profile trains {params['model']} all the same: the favoured model's training does not fit "
                   f"its budget (the `cpu-full` profile trains a larger one).")


def headline(tables: Tables) -> dict:
    tpf, seen = tables.table.tokens_per_target_forward, tables.tokens_per_forward_by_prompts[TRAINED_ON]
    cllm = tables.table.loc[lineups.CLLM_JACOBI]
    line = {
        "Jacobi tokens/forward, base": round(float(tpf[lineups.BASE_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM": round(float(tpf[lineups.CLLM_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM on training prompts": round(float(seen[lineups.CLLM_JACOBI]), 3),
        "Jacobi (CLLM) speedup over AR (per token)": words.interval(Speedup.from_line(cllm)),
        "CLLM agreement with base greedy": round(float(tables.table.agreement[lineups.CLLM_JACOBI]), 3),
    }
    if tables.choice is not None:
        line["CLLM taken at (by its learning curves)"] = (
            f"{tables.choice.recipe}, step {tables.choice.step}"
            + ("" if tables.choice.kept_the_text else " (no checkpoint kept the base's text: the least drifted)"))
    if tables.cllm_lookahead is not None:
        lookahead = tables.table.loc[tables.cllm_lookahead]
        line[f"{tables.cllm_lookahead}: tokens/forward"] = round(float(lookahead.tokens_per_target_forward), 3)
        line[f"{tables.cllm_lookahead}: speedup over AR (per token)"] = words.interval(Speedup.from_line(lookahead))
    if tables.accuracy is not None:
        accuracy, names = tables.accuracy, accuracy_names(tables.accuracy)
        shares = " / ".join(f"{accuracy.exact_match[method]:.2f}" for method in names)
        label = f"{tables.answer_key.measure}, " + " / ".join(names.values())
        line[label] = f"{shares} ({int(accuracy.prompts.max())} prompts)"
    return line


def findings(tables: Tables, params: dict) -> str:
    n = jacobi_numbers(tables)
    return (
        f"On {n['held_out_prompts']} held-out prompts, Jacobi decoding of the base model makes **{n['base_tpf']:.2f}** "
        f"tokens per forward pass; after {n['training_steps']} training steps on {n['training_prompts']} prompts "
        f"({n['looping_removed']} looping generations removed) the CLLM makes **{n['cllm_tpf']:.2f}** "
        f"(blocks of {params['block_size']}: {n['base_iterations']:.1f} vs {n['cllm_iterations']:.1f} iterations "
        f"per block). On {n['seen_prompts']} of its training prompts it makes {n['cllm_seen_tpf']:.2f} "
        f"(base {n['base_seen_tpf']:.2f}). A Jacobi iteration over the block costs {n['jacobi_cost']:.2f}x an AR step "
        f"here ({params['dtype']}, {params['device']}), so Jacobi pays only above about {n['jacobi_cost']:.2f} tokens "
        f"per forward: measured speedup over AR is {n['base_speedup']:.2f}x for the base model and "
        f"{n['cllm_speedup']:.2f}x for the CLLM. "
        + cllm_lookahead_findings(tables)
        + f"Quality: the CLLM's greedy text matches the base model's on {n['cllm_agreement']:.0%} of its tokens "
        f"on average before the first difference; the NLL of the base model's held-out answers goes from "
        f"{n['base_nll']:.3f} to {n['cllm_nll']:.3f} nats per token; {n['looping']} of the CLLM's {n['cllm_answers']} "
        f"held-out answers loop (an 8-token sequence three times or more), which converges in few iterations."
        + accuracy_findings(tables, params))


def cllm_lookahead_findings(tables: Tables) -> str:
    """Lookahead decoding of the CLLM against AR, and its tokens per forward against the base model's
    lookahead at the same W, N, G ("" when it did not run)."""
    if tables.cllm_lookahead is None:
        return ""
    line, table = tables.table.loc[tables.cllm_lookahead], tables.table
    cost = line.ms_per_decode_forward / table.ms_per_decode_forward[lineups.BASE_AR]
    return (f"Lookahead decoding of the CLLM ({tables.cllm_lookahead}) makes **{line.tokens_per_target_forward:.2f}** "
            f"tokens per forward (the base model {table.tokens_per_target_forward[tables.base_lookahead]:.2f} at the "
            f"same W, N, G) at {cost:.2f}x the time of an AR step (decode forwards): "
            f"**{words.interval(Speedup.from_line(line))}** AR. ")


def accuracy_findings(tables: Tables, params: dict) -> str:
    """Exact match of the base model and the CLLM by the prompt set's answer key, prompt by prompt,
    and of the pretrained model when the base was fine-tuned first ("" for a prompt set without
    checkable answers)."""
    if tables.accuracy is None:
        return ""
    accuracy, pairs, key = tables.accuracy, tables.accuracy_pairs, tables.answer_key
    text = (f" Task quality ({key.measure}): {accuracy.exact_match[lineups.BASE_AR]:.0%} of the held-out prompts "
            f"are answered right by the base model and {accuracy.exact_match[lineups.CLLM_JACOBI]:.0%} by the CLLM "
            f"({int(accuracy.prompts.max())} prompts, {params['max_new_tokens']} tokens: a longer answer is cut off "
            f"and cannot match).")
    if pairs and sum(pairs.values()):
        text += (f" Prompt by prompt, the base model answers {pairs['only_first']} right that the CLLM gets wrong and "
                 f"the CLLM {pairs['only_second']} the other way ({pairs['both']} right in both, {pairs['neither']} in "
                 f"neither): one prompt is {100 / sum(pairs.values()):.0f} points of accuracy here.")
    if lineups.PRETRAINED_AR in accuracy_names(accuracy):
        per_step = params["sft_answers_per_step"]
        text += (f" The base model is {params['model']} after {params['sft_steps']} steps of fine-tuning ({per_step} "
                 f"answer{'s' * (per_step != 1)} each) on {key.reference} of the training side; before them it "
                 f"matched {accuracy.exact_match[lineups.PRETRAINED_AR]:.0%}.")
    return text


def learning_curve_findings(curve, recipe: str) -> str:
    """Whether more training of `recipe` would pay, read from its learning curve's later half."""
    trend = None if curve is None else learning_trend(curve[curve.recipe == recipe])
    if trend is None:
        return ""
    text = (f"With {recipe}, Jacobi tokens per forward went from **{trend.first:.2f}** (the base model) to "
            f"**{trend.last:.2f}** after {trend.last_step} steps; over the later half of training they changed by "
            f"{trend.slope_per_100_steps:+.2f} per 100 steps. ")
    if trend.steps_to_goal == 0:
        return text + f"That reaches the {trend.goal:.1f} tokens per forward a CLLM should make."
    if trend.steps_to_goal is None:
        return text + (f"The curve is not rising: more steps of this recipe would not reach {trend.goal:.1f} tokens "
                       f"per forward.")
    return text + (f"A straight continuation would reach {trend.goal:.1f} tokens per forward after about "
                   f"{trend.steps_to_goal:,.0f} more steps (a line through few noisy points: an order of magnitude, "
                   f"not a forecast).")


def choice_findings(tables: Tables, params: dict) -> str:
    """Which recipe and step the learning curves chose as the CLLM, and why: the most tokens per forward
    among the checkpoints that kept the base model's text ("" without learning curves)."""
    curve, choice = tables.learning_curve, tables.choice
    if curve is None or choice is None:
        return ""
    base = curve[curve.step == 0].iloc[0]
    chosen = curve[(curve.recipe == choice.recipe) & (curve.step == choice.step)].iloc[0]
    recipes = curve.recipe.unique()
    text = (f"The learning curves are read on {int(base.prompts)} held-out prompts that the comparison below never "
            f"uses. {len(recipes)} recipe{'s' * (len(recipes) != 1)} trained ({'; '.join(recipes)}). A checkpoint "
            f"keeps the base model's text when the NLL of the base's greedy answers stays within "
            f"{params['max_nll_rise']:.2f} nats a token of the base's own ({base.nll_per_token:.3f}, so at most "
            f"{choice.nll_limit:.3f}) and no more of its answers loop ({int(base.looping)} for the base). ")
    found = (f"**{choice.recipe}, after {choice.step} steps**: {chosen.tokens_per_target_forward:.2f} tokens per forward "
             f"(base {base.tokens_per_target_forward:.2f}), NLL {chosen.nll_per_token:.3f}, agreement with the base's "
             f"text {chosen.agreement:.0%}.")
    if choice.kept_the_text:
        return text + "Of those that did, the CLLM is the one that fixes the most tokens per forward: " + found
    return text + ("**No trained checkpoint kept it.** The CLLM below is the one that drifted least, so its text is "
                   "not the base model's: " + found)


def forward_check_findings(check, model_label: str) -> str:
    """Each method's decode forward against T(n) at the n it fed, and whether every parallel one is
    within the tolerance of the curve. The verdict reads the curve scaled to AR's own forward, measured
    interleaved with the method's (`over_curve_at_ar_step`): the curve is timed after the rows, and a
    drift of the machine between them must not pass for a decoder's cost. Without an AR row, the curve as timed."""
    if check is None or check.empty:
        return ""
    lines = [f"Decode forwards against the cost curve of {model_label}, T(n) measured at every n they fed, right "
             f"after them in the same process; in brackets, T(n)/T(1) times AR's own decode forward, which ran "
             f"interleaved with them:"]
    scaled = check.over_curve_at_ar_step.notna().all() if "over_curve_at_ar_step" in check else False
    for name, line in check.iterrows():
        beside_ar = f" ({line.over_curve_at_ar_step:.2f}x at AR's step)" if scaled else ""
        lines.append(f"- {name}: {line.mean_tokens_per_forward_fed:.1f} tokens a forward on average (at most "
                     f"{int(line.largest_forward)}), {line.ms_per_decode_forward:.1f} ms against T(n) "
                     f"{line.curve_ms:.1f} ms: **{line.forward_over_curve:.2f}x**{beside_ar}.")
    parallel = check[check.index != lineups.BASE_AR]
    ratio = parallel.over_curve_at_ar_step if scaled else parallel.forward_over_curve
    reading = "T(n) scaled to AR's step" if scaled else "T(n)"
    over = parallel[ratio > 1 + FORWARD_COST_TOLERANCE]
    if over.empty:
        lines.append(f"\nEvery parallel decoder's forward is within {FORWARD_COST_TOLERANCE:.0%} of {reading} at its n.")
    else:
        lines.append(f"\n{len(over)} of {len(parallel)} parallel decoders cost more than {FORWARD_COST_TOLERANCE:.0%} "
                     f"above {reading} at their n: {', '.join(over.index)}.")
    return "\n".join(lines)


def reference_findings(tables: Tables, params: dict) -> str:
    table = tables.reference_table
    parallel = table[table.index != lineups.BASE_AR]
    best = parallel.speedup.idxmax()
    lines = [f"Untrained {params['reference_model']} ({tables.reference_precision}), {int(table.prompts.max())} "
             f"held-out prompts, {params['max_new_tokens']} tokens:"]
    for name, line in parallel.iterrows():
        cost = line.ms_per_decode_forward / table.ms_per_decode_forward[lineups.BASE_AR]
        lines.append(f"- {name}: **{line.tokens_per_target_forward:.2f}** tokens per forward at {cost:.2f}x the "
                     f"time of an AR step: **{words.interval(Speedup.from_line(line))}** AR, agreement with AR "
                     f"greedy {line.agreement:.2f}, {line.extra_memory_mb:.0f} MB of memory beyond AR's.")
    verdict = "pays" if parallel.speedup_low[best] > 1 else "does not pay beyond the noise"
    lines.append(f"\nThe best, {best}, {verdict} here: a pass must carry more tokens than it costs AR steps.")
    return "\n".join(lines)
