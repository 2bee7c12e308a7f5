"""Every method the notebooks measure, built in one place as `Method` records, and the line-ups
that group them. A method's name is what tables and plots show; what it *is* (lossless, role,
implementation, parameters) is data on the record.

Stateful candidate generators (a draft model's KV cache, an adaptive draft length) are built anew
for every call, so nothing carries over from one prompt to the next. The one exception is by design:
suffix decoding keeps the method's earlier answers (one per prompt; a prompt never reads its own).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from specdec_lab.decoders import (autoregressive, batched, draft_then_score, hf_peers, jacobi, llama_cpp_peer,
                                  lookahead, speculative, vllm_peer)
from specdec_lab.decoders.backend import engine as engine_of, stop_token_ids
from specdec_lab.decoders.candidates import (CandidateGenerator, DraftModelCandidates, DraftTreeCandidates,
                                            HybridCandidates, PromptLookupCandidates, PromptLookupTreeCandidates,
                                            SuffixTrackRecord)
from specdec_lab.decoders.suffix import ArcticSuffixCandidates, SuffixCandidates, SuffixTrie, arctic_cache
from specdec_lab.decoders.trees import depths
from specdec_lab.method import (SCHEDULES, CandidateSource, HybridSettings, LookaheadConfig, Method, SuffixSettings,
                                TreeSettings, Weights, parse_shape, shape_label)
from specdec_lab.models import LoadedModel, check_same_tokenizer, quantize
from specdec_lab.sampling import GREEDY, Sampling

TARGET_AR = "target AR (ours)"
DRAFT_AR = "draft AR (ours)"
BASE_AR = "AR (base)"
PRETRAINED_AR = "AR (pretrained, before fine-tuning)"  # when 04 fine-tunes the base on reference answers first
BASE_JACOBI = "Jacobi (base)"
CLLM_JACOBI = "Jacobi (CLLM)"
BATCHED_AR = "AR (ours, batched)"
BATCHED_GENERATE = "AR (transformers generate, batched)"


# --- single methods -------------------------------------------------------------------------------

def ar(model: LoadedModel, max_new_tokens: int, sampling: Sampling = GREEDY, name: str = TARGET_AR,
       role: str = "target AR", lossless: bool = True, weights: Weights | None = None) -> Method:
    """Our AR loop (prefill, then one token per forward)."""
    def decode(prompt_ids):
        return autoregressive.generate(model.model, prompt_ids, max_new_tokens, sampling)
    return Method(name, decode, lossless=lossless, role=role, weights=weights, engine=engine_of(model.model))


def transformers_generate(model: LoadedModel, max_new_tokens: int, sampling: Sampling = GREEDY,
                          name: str = "target generate (transformers)", role: str = "target AR",
                          lossless: bool = True, source: CandidateSource | None = None, **generate_kwargs) -> Method:
    """transformers' `generate`, plain or with its assisted-generation / prompt-lookup options."""
    def decode(prompt_ids):
        return hf_peers.generate(model.model, prompt_ids, max_new_tokens, sampling, **generate_kwargs)
    return Method(name, decode, lossless=lossless, role=role, implementation="transformers", source=source)


def with_candidates(target: LoadedModel, make_candidates: Callable[[], CandidateGenerator], max_new_tokens: int,
                    sampling: Sampling, name: str, source: CandidateSource, lossless: bool = True,
                    weights: Weights | None = None) -> Method:
    """Our speculative decoder with a candidate source built fresh for every call (a peer's source, such as
    arctic-inference's suffix tree, names the method's implementation: what it proposes is theirs)."""
    def decode(prompt_ids):
        return speculative.generate(target.model, make_candidates(), prompt_ids, max_new_tokens, sampling)
    return Method(name, decode, lossless=lossless, role="speculative", source=source, weights=weights,
                  engine=engine_of(target.model), implementation=source.implementation)


# --- candidate sources: each described once, by the record the line-up and the picker share ------

def draft_source(k: int, schedule: str = "constant", confidence_threshold: float = 0.0,
                 implementation: str = "ours") -> CandidateSource:
    return CandidateSource("draft model", implementation, k=k, schedule=schedule,
                           confidence_threshold=confidence_threshold)


def prompt_lookup_source(k: int, match: str = "longest", implementation: str = "ours",
                         cost_sized: bool = False) -> CandidateSource:
    """Ours: match="longest" (its proposal length adapts per kind of match; `cost_sized`: cut by the
    target's T(n)) or "latest", n-grams up to PROMPT_LOOKUP_NGRAM; transformers': match="first", n-grams up
    to its own default."""
    if implementation == "transformers":
        return CandidateSource("prompt lookup", "transformers", k=k, match="first",
                               max_ngram=TRANSFORMERS_PROMPT_LOOKUP_NGRAM)
    return CandidateSource("prompt lookup", k=k, match=match, max_ngram=PROMPT_LOOKUP_NGRAM,
                           schedule="heuristic" if match == "longest" else None, cost_sized=cost_sized)


def hybrid_source(k: int, prompt_lookup_k: int, settings: HybridSettings = HybridSettings(),
                  adaptive_threshold: float = 0.4, cost_sized: bool = False, suffix_k: int = 0,
                  suffix: SuffixSettings | None = None) -> CandidateSource:
    """The hybrid: the draft (adaptive k from `k`) or, model-free, prompt lookup (`prompt_lookup_k` tokens) or, given
    `suffix_k` > 0, suffix decoding in its place (a tree of `suffix_k` nodes under the `suffix` rules)."""
    if suffix_k:
        return CandidateSource("hybrid", k=k, schedule="heuristic", confidence_threshold=adaptive_threshold,
                               hybrid=settings, tree=TreeSettings(suffix_k), suffix=suffix or SuffixSettings(),
                               cost_sized=cost_sized)
    return CandidateSource("hybrid", k=k, schedule="heuristic", confidence_threshold=adaptive_threshold,
                           prompt_lookup_k=prompt_lookup_k, hybrid=settings, cost_sized=cost_sized)


def hybrid_suffix(suffix_k: int, suffix: SuffixSettings | None, relative_target=None) -> Callable[[], SuffixCandidates | None]:
    """What builds the hybrid's suffix-decoding source for each call (None where `suffix_k` is 0): every call's
    source reads and extends one tree of the answers given before, as the line-up's suffix decoding does."""
    if not suffix_k:
        return lambda: None
    settings = suffix or SuffixSettings()
    history = SuffixTrie(settings.max_depth)
    return lambda: SuffixCandidates(suffix_k, True, settings, history, relative_target)


def hybrid_label(k: int, prompt_lookup_k: int, suffix_k: int = 0, draft_tree: str | None = None) -> str:
    """What the hybrid chooses among, for its name."""
    model_free = f"suffix tree <= {suffix_k} nodes" if suffix_k else f"prompt lookup k={prompt_lookup_k}"
    if draft_tree:
        return f"{model_free} or {draft_tree_label(parse_shape(draft_tree))}"
    return f"{model_free} or draft adaptive k from {k}"


CUT_LABEL = ", cut by T(n)"  # the name of a method whose proposals are cut by the target's measured cost


def draft_model_speculative(target: LoadedModel, draft: LoadedModel, k: int, max_new_tokens: int,
                            sampling: Sampling = GREEDY, schedule: str = "constant",
                            confidence_threshold: float = 0.0, name: str | None = None,
                            lossless: bool = True, weights: Weights | None = None) -> Method:
    """Our speculative decoder with a draft model: k constant, or the heuristic schedule from k."""
    name = name or f"speculative {draft_length_label(k, schedule, confidence_threshold)} (ours)"
    return with_candidates(
        target, lambda: DraftModelCandidates(draft.model, k, schedule, confidence_threshold), max_new_tokens, sampling,
        name, draft_source(k, schedule, confidence_threshold), lossless, weights)


def draft_length_label(k: int, schedule: str = "constant", confidence_threshold: float = 0.0) -> str:
    """How a row names its draft-length policy: the same words for ours and transformers'."""
    if schedule == "constant":
        label = f"k={k}"
    else:
        label = f"adaptive k from {k}"
    return label + (f", stop below p={confidence_threshold:g}" if confidence_threshold else "")


PROMPT_LOOKUP_NGRAM = 3  # ours, match="latest": the longest n-gram tried (down to 1), latest occurrence first
TRANSFORMERS_PROMPT_LOOKUP_NGRAM = 2  # transformers' max_matching_ngram_size default; it takes the first occurrence


def prompt_lookup(target: LoadedModel, k: int, max_new_tokens: int, sampling: Sampling = GREEDY,
                  name: str | None = None, lossless: bool = True, weights: Weights | None = None,
                  match: str = "longest", relative_target=None) -> Method:
    """Our prompt lookup: the longest match, its proposal adapted per kind of match (see
    PromptLookupCandidates), or with match="latest" the classic latest-n-gram rule. `relative_target`:
    the target's measured T(n) / T(1), each proposal then cut to the tokens worth verifying at it."""
    label = (f"k={k} adaptive, longest match" if match == "longest"
             else f"k={k}, n<={PROMPT_LOOKUP_NGRAM}, latest match")
    cut = relative_target is not None
    return with_candidates(target, lambda: PromptLookupCandidates(k, max_ngram=PROMPT_LOOKUP_NGRAM, match=match,
                                                                  relative_target=relative_target),
                           max_new_tokens, sampling, name or f"prompt lookup {label}{CUT_LABEL if cut else ''} (ours)",
                           prompt_lookup_source(k, match, cost_sized=cut), lossless, weights)


def draft_tree(target: LoadedModel, draft: LoadedModel, depth: int, tree: TreeSettings, max_new_tokens: int,
               sampling: Sampling = GREEDY) -> Method:
    """Our draft-model token tree (EAGLE-2's dynamic expansion, `DraftTreeCandidates`)."""
    if tree.beam is None:
        raise ValueError(f"a draft tree grows `beam` nodes a level: give beam in {tree}")
    return with_candidates(
        target, lambda: DraftTreeCandidates(draft.model, depth, tree.branching, tree.beam, tree.nodes),
        max_new_tokens, sampling, f"draft {tree.label()}, depth {depth} (ours)",
        CandidateSource("draft model", k=depth, tree=tree))


def sized_draft_tree(target: LoadedModel, draft: LoadedModel, shape: Sequence[tuple[int, int]], max_new_tokens: int,
                     sampling: Sampling = GREEDY, confidence_threshold: float = 0.0) -> Method:
    """Our draft model filling a fixed tree: Sequoia's, which the picker sized from this machine's T(n)
    and the draft's per-rank acceptance (`picker.size_tree`), stopping where the draft is unsure on its
    main path (`confidence_threshold`, the adaptive chain's)."""
    stop = f", stop below p={confidence_threshold}" if confidence_threshold else ""
    if tree_depth(shape) == len(shape):  # sized as a chain: the chain's decoder drafts the same tokens, unmasked
        def make():
            return DraftModelCandidates(draft.model, len(shape), "constant", confidence_threshold)
    else:
        def make():
            return DraftTreeCandidates(draft.model, shape=shape, confidence_threshold=confidence_threshold)
    return with_candidates(
        target, make, max_new_tokens, sampling,
        f"{draft_tree_label(shape)}{stop}, sized by the picker (ours)",
        sized_tree_source(shape, confidence_threshold))


def sized_tree_source(shape: Sequence[tuple[int, int]], confidence_threshold: float = 0.0) -> CandidateSource:
    widest = max(Counter(parent for parent, _ in shape).values())
    return CandidateSource("draft model", k=tree_depth(shape), confidence_threshold=confidence_threshold,
                           tree=TreeSettings(len(shape), widest, shape=shape_label(shape)))


def tree_depth(shape: Sequence[tuple[int, int]]) -> int:
    return max(depths([parent for parent, _ in shape]))


def draft_tree_label(shape: Sequence[tuple[int, int]]) -> str:
    """How a method's name gives the draft's fixed tree."""
    return f"draft tree, {len(shape)} nodes, depth {tree_depth(shape)}"


def prompt_lookup_tree(target: LoadedModel, k: int, tree: TreeSettings, max_new_tokens: int,
                       sampling: Sampling = GREEDY) -> Method:
    """Our prompt lookup merging several matches into a trie (`PromptLookupTreeCandidates`): its
    branches adapt their length as the chain's do."""
    return with_candidates(
        target, lambda: PromptLookupTreeCandidates(k, tree.branching, tree.nodes), max_new_tokens, sampling,
        f"prompt lookup {tree.label()}, k={k} adaptive (ours)", prompt_lookup_tree_source(k, tree))


def prompt_lookup_tree_source(k: int, tree: TreeSettings) -> CandidateSource:
    return CandidateSource("prompt lookup", k=k, match="longest", schedule="heuristic", tree=tree)


def suffix_decoding(target: LoadedModel, k: int, tree: bool, settings: SuffixSettings, max_new_tokens: int,
                    sampling: Sampling = GREEDY, implementation: str = "ours", relative_target=None) -> Method:
    """Suffix decoding (`decoders.suffix`): ours, or arctic-inference's suffix tree behind the same
    verifier. The method owns the tree of its earlier answers, which every call reads and extends.
    `relative_target`: the target's measured T(n) / T(1), each proposal then cut to the nodes worth verifying."""
    if implementation == "ours":
        history = SuffixTrie(settings.max_depth)
        def make():
            return SuffixCandidates(k, tree, settings, history, relative_target)
    elif implementation == "arctic-inference":
        cache = arctic_cache(settings.max_depth)
        def make():
            return ArcticSuffixCandidates(cache, k, tree, settings, relative_target)
    else:
        raise ValueError(f"suffix decoding is implemented by 'ours' or 'arctic-inference', not {implementation!r}")
    cut = relative_target is not None
    shape = (f"tree <= {k} nodes" if tree else f"path <= {k} tokens") + (CUT_LABEL if cut else "")
    return with_candidates(target, make, max_new_tokens, sampling, f"suffix decoding, {shape} ({implementation})",
                           suffix_source(k, tree, settings, implementation, cut))


def suffix_source(k: int, tree: bool, settings: SuffixSettings, implementation: str = "ours",
                  cost_sized: bool = False) -> CandidateSource:
    return CandidateSource("suffix", implementation, k=k, tree=TreeSettings(k) if tree else None, suffix=settings,
                           cost_sized=cost_sized)


def hybrid(target: LoadedModel, draft: LoadedModel, k: int, prompt_lookup_k: int, max_new_tokens: int,
           cost_ratio: float, sampling: Sampling = GREEDY, adaptive_threshold: float = 0.4,
           settings: HybridSettings | None = None, name: str | None = None, lossless: bool = True,
           weights: Weights | None = None, prefill_cost_ratio: float = 0.0, relative_target=None,
           suffix_k: int = 0, suffix: SuffixSettings | None = None) -> Method:
    """Our hybrid candidate source: each step prompt lookup, the draft model (adaptive k from k),
    lookup continued by the draft, or nothing, chosen from the match and the acceptance so far
    (see HybridCandidates); given `suffix_k` > 0, suffix decoding's tree (`suffix` rules) proposes in the
    lookup's place, with a tree of the method's earlier answers that every call reads and extends, and the record
    of how much of the trees' expected tokens the target accepted in the earlier calls (`SuffixTrackRecord`).
    `cost_ratio` = draft step / target step, measured on this machine (a measurement fed to the source, not part
    of what it is); `settings`: as the draft picker chose them (None: the record's defaults, which are
    HybridCandidates'); `prefill_cost_ratio` = the draft's prefill per token / target step, another measurement
    (0: the draft's catch-up is not charged);
    `relative_target`: the target's measured T(n) / T(1), verifying then priced by it and lookups cut by it."""
    settings = settings or HybridSettings()
    cut = relative_target is not None
    suffix_source_of_call = hybrid_suffix(suffix_k, suffix, relative_target)
    suffix_record = SuffixTrackRecord()  # the trees' acceptance over the method's calls, as its earlier answers

    def make():
        return HybridCandidates(draft.model, k, prompt_lookup_k, cost_ratio=cost_ratio,
                                confidence_threshold=adaptive_threshold, prior_acceptance=settings.prior_acceptance,
                                extend_lookups=settings.extend_lookups, prefill_cost_ratio=prefill_cost_ratio,
                                relative_target=relative_target, suffix=suffix_source_of_call(),
                                suffix_record=suffix_record, suffix_prior_tokens=settings.suffix_prior_tokens,
                                draft_tree=settings.draft_tree_shape())
    label = hybrid_label(k, prompt_lookup_k, suffix_k, settings.draft_tree)
    name = name or f"hybrid: {label}{CUT_LABEL if cut else ''} (ours)"
    return with_candidates(target, make, max_new_tokens, sampling, name,
                           hybrid_source(k, prompt_lookup_k, settings, adaptive_threshold, cut, suffix_k, suffix),
                           lossless, weights)


def llama_cpp_ar(engine: llama_cpp_peer.LlamaCppPeer, like: LoadedModel, max_new_tokens: int,
                 name: str = "llama.cpp AR (GGUF as is)", weights: Weights | None = None) -> Method:
    """llama.cpp's greedy decoding of the GGUF file `like` was converted from, stopping on the same
    tokens (with the engine's prompt lookup when it has one). Not lossless: its weights (Q4_K/Q6_K
    blocks) and arithmetic are its own."""
    stop_ids = stop_token_ids(like.model, like.tokenizer)
    k = engine.prompt_lookup_tokens
    # llama-cpp-python's LlamaPromptLookupDecoding, its defaults: n-grams up to 2
    source = CandidateSource("prompt lookup", "llama.cpp", k=k, max_ngram=2) if k else None

    def decode(prompt_ids):
        return llama_cpp_peer.generate(engine, prompt_ids, max_new_tokens, stop_ids)
    return Method(name, decode, lossless=False, role="speculative" if k else "target AR", implementation="llama.cpp",
                  source=source, weights=weights, engine="llama.cpp")


def llama_cpp_prompt_lookup(engine: llama_cpp_peer.LlamaCppPeer, like: LoadedModel, max_new_tokens: int) -> Method:
    """llama.cpp's own prompt-lookup decoding on the same GGUF file (an engine loaded with
    prompt_lookup_tokens > 0)."""
    return llama_cpp_ar(engine, like, max_new_tokens,
                        name=f"llama.cpp prompt lookup k={engine.prompt_lookup_tokens} (GGUF as is)")


def vllm(engine: vllm_peer.StartedOnFirstUse, source: CandidateSource | None, max_new_tokens: int, name: str,
         batched: bool = False) -> Method:
    """vLLM's greedy decoding of the target's own weights (bf16, or widened to fp32), with its speculation
    `source` as the engine was loaded with it (None: AR); `batched` (notebook 05): `decode([prompt_ids, ...])`
    decodes the batch in one vLLM call. Declared lossless: the weights are the unquantized target's, and
    vLLM's speculation keeps greedy text in exact arithmetic (its tests check both in fp32)."""
    if source is not None and source.implementation != "vllm":
        raise ValueError(f"a vLLM method runs vLLM's own speculation: its source's implementation must be 'vllm', "
                         f"got {source.implementation!r}")
    generate = vllm_peer.generate_batch if batched else vllm_peer.generate

    def decode(prompts):
        return generate(engine, prompts, max_new_tokens)
    return Method(name, decode, lossless=True, role="target AR" if source is None else "speculative",
                  implementation="vllm", source=source, engine="vllm")


def draft_then_score_method(target: LoadedModel, draft: LoadedModel, max_new_tokens: int,
                            sampling: Sampling = GREEDY) -> Method:
    """The seed blog's recipe: the draft's text, scored once by the target. Not lossless."""
    def decode(prompt_ids):
        return draft_then_score.generate(target.model, draft.model, prompt_ids, max_new_tokens, sampling)
    return Method("draft-then-score (blog; not lossless)", decode, lossless=False, role="lossy",
                  engine=engine_of(target.model))


def jacobi_method(model: LoadedModel, max_new_tokens: int, block_size: int, init: str, name: str,
                  lossless: bool, weights: Weights | None = None) -> Method:
    def decode(prompt_ids):
        return jacobi.generate(model.model, prompt_ids, max_new_tokens, block_size=block_size, init=init)
    return Method(name, decode, lossless=lossless, role="parallel", weights=weights,
                  source=CandidateSource("jacobi", block_size=block_size, init=init), engine=engine_of(model.model))


CLLM_WEIGHTS = Weights(model_role="CLLM")  # the methods that run the fine-tuned model, not the base


def lookahead_name(config: LookaheadConfig | dict, model_label: str = "base") -> str:
    return f"Lookahead {LookaheadConfig.from_mapping(config).label()} ({model_label})"


def cllm_lookahead_names(lookahead_configs: Sequence[dict]) -> tuple[str, str] | tuple[None, None]:
    """The names of lookahead decoding on the CLLM in `cllm`'s line-up (the first config) and on the
    base model at the same config; (None, None) when there is no lookahead config."""
    if not lookahead_configs:
        return None, None
    return lookahead_name(lookahead_configs[0], "CLLM"), lookahead_name(lookahead_configs[0], "base")


def lookahead_method(model: LoadedModel, max_new_tokens: int, config: LookaheadConfig | dict,
                     model_label: str = "base", lossless: bool = True, weights: Weights | None = None) -> Method:
    """Lookahead decoding (greedy: it returns `model`'s greedy text) with a config {window, ngram_size,
    candidates?, pool_from_prompt?}. `lossless=False` for a fine-tuned model, whose text is its own."""
    config = LookaheadConfig.from_mapping(config)

    def decode(prompt_ids):
        return lookahead.generate(model.model, prompt_ids, max_new_tokens, config.window, config.ngram_size,
                                  config.candidates, config.pool_from_prompt)
    return Method(lookahead_name(config, model_label), decode, lossless=lossless, role="parallel", weights=weights,
                  source=CandidateSource("lookahead", lookahead=config), engine=engine_of(model.model))


# --- line-ups -------------------------------------------------------------------------------------

def baseline(target: LoadedModel, draft: LoadedModel | None, max_new_tokens: int,
             sampling: Sampling = GREEDY) -> list[Method]:
    """Our AR loop and transformers' generate, on the target and (optionally) the draft."""
    methods = [ar(target, max_new_tokens, sampling), transformers_generate(target, max_new_tokens, sampling)]
    if draft is not None:
        methods += [ar(draft, max_new_tokens, sampling, name=DRAFT_AR, role="draft AR", lossless=False),
                    transformers_generate(draft, max_new_tokens, sampling, name="draft generate (transformers)",
                                          role="draft AR", lossless=False)]
    return methods


def speculative_methods(target: LoadedModel, draft: LoadedModel, k: int, max_new_tokens: int,
                        sampling: Sampling = GREEDY, prompt_lookup_k: int = 10,
                        universal_draft: LoadedModel | None = None, lossy: bool = True,
                        transformers_defaults: bool = True, adaptive_threshold: float = 0.4,
                        schedules: Sequence[str] = SCHEDULES, hybrid_cost_ratio: float | None = None,
                        hybrid_settings: HybridSettings | None = None, hybrid_prefill_ratio: float = 0.0,
                        tree_shape: Sequence[tuple[int, int]] | None = None,
                        lookup_tree: TreeSettings | None = None, suffix_k: int = 0,
                        suffix: SuffixSettings = SuffixSettings(), suffix_path: bool = True,
                        suffix_peer: bool = False, relative_target=None) -> list[Method]:
    """AR baseline; our speculative decoder and transformers' assisted generation configured alike,
    for each of `schedules` (k constant; the heuristic schedule from the same k with the same
    confidence stop); prompt lookup, each named by its own n-gram rule; optionally transformers'
    assisted generation with its own defaults, the blog's draft-then-score (`lossy`), universal
    assisted generation with a draft of another tokenizer, (given the draft's cost ratio) our
    hybrid candidate source, token trees: the draft filling `tree_shape` (the picker's) and
    prompt lookup merging matches into `lookup_tree`, and (`suffix_k` > 0) suffix decoding as a tree and
    (`suffix_path`) as a path, with (`suffix_peer`) arctic-inference's suffix tree beside ours. Given
    `relative_target`, the target's measured T(n) / T(1), our model-free sources (prompt lookup, the hybrid's
    lookups, every suffix decoding) cut their proposals to the tokens worth verifying at it."""
    unknown = [schedule for schedule in schedules if schedule not in SCHEDULES]
    if unknown or not schedules:
        raise ValueError(f"schedules must be a non-empty list of {list(SCHEDULES)}, got {list(schedules)}")

    def peer(name: str, source: CandidateSource, **kwargs) -> Method:
        return transformers_generate(target, max_new_tokens, sampling, name=name, role="speculative",
                                     source=source, **kwargs)

    def threshold(schedule: str) -> float:
        return adaptive_threshold if schedule == "heuristic" else 0.0

    ours = [draft_model_speculative(target, draft, k, max_new_tokens, sampling, schedule, threshold(schedule))
            for schedule in schedules]
    theirs = [peer(f"assisted {draft_length_label(k, schedule, threshold(schedule))} (transformers)",
                   draft_source(k, schedule, threshold(schedule), "transformers"),
                   assistant_model=draft.model, num_assistant_tokens=k, num_assistant_tokens_schedule=schedule,
                   assistant_confidence_threshold=threshold(schedule))
              for schedule in schedules]
    methods = [
        ar(target, max_new_tokens, sampling),
        *ours,
        prompt_lookup(target, prompt_lookup_k, max_new_tokens, sampling, relative_target=relative_target),
        *([hybrid(target, draft, k, prompt_lookup_k, max_new_tokens, hybrid_cost_ratio, sampling, adaptive_threshold,
                  hybrid_settings, prefill_cost_ratio=hybrid_prefill_ratio, relative_target=relative_target,
                  suffix_k=suffix_k, suffix=suffix)]
          if hybrid_cost_ratio is not None else []),
        *theirs,
        peer(f"prompt lookup k={prompt_lookup_k}, n<={TRANSFORMERS_PROMPT_LOOKUP_NGRAM}, first match (transformers)",
             prompt_lookup_source(prompt_lookup_k, implementation="transformers"),
             prompt_lookup_num_tokens=prompt_lookup_k),
    ]
    if tree_shape:
        methods.append(sized_draft_tree(target, draft, tree_shape, max_new_tokens, sampling, adaptive_threshold))
    if lookup_tree is not None:
        methods.append(prompt_lookup_tree(target, prompt_lookup_k, lookup_tree, max_new_tokens, sampling))
    if suffix_k:
        methods += [suffix_decoding(target, suffix_k, tree, suffix, max_new_tokens, sampling,
                                    relative_target=relative_target)
                    for tree in ((True, False) if suffix_path else (True,))]
        if suffix_peer:
            methods.append(suffix_decoding(target, suffix_k, True, suffix, max_new_tokens, sampling, "arctic-inference",
                                           relative_target))
    if transformers_defaults:
        methods.append(peer("assisted k=20 constant, stop below p=0.4 (transformers defaults)",
                            draft_source(20, "constant", 0.4, "transformers"),
                            assistant_model=draft.model, num_assistant_tokens=20,
                            num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.4))
    if lossy:
        methods.append(draft_then_score_method(target, draft, max_new_tokens, sampling))
    if universal_draft is not None:
        methods.append(peer("universal assisted (transformers)",
                            CandidateSource("draft model, other tokenizer", "transformers"),
                            assistant_model=universal_draft.model, tokenizer=target.tokenizer,
                            assistant_tokenizer=universal_draft.tokenizer))
    return methods


def k_sweep(target: LoadedModel, draft: LoadedModel, k_values: Sequence[int], max_new_tokens: int,
            sampling: Sampling = GREEDY) -> list[Method]:
    """Our speculative decoder at each k (`method.source.k`), constant k: the sweep joins a
    line-up that holds the target's AR."""
    return [draft_model_speculative(target, draft, k, max_new_tokens, sampling) for k in k_values]


def quantized_pairs(target: LoadedModel, drafts: Sequence[tuple[quantize.Pair, LoadedModel]], k: int,
                    max_new_tokens: int, dtype: str) -> list[Method]:
    """AR of one target variant and every speculative pair on it. Only an unquantized target's
    output is declared lossless: a quantized target's greedy text is not the original model's."""
    target_quantization = drafts[0][0].target if drafts else target.quantization
    unquantized = target_quantization == "none"
    methods = [ar(target, max_new_tokens, name=f"target {quantize.label(target_quantization, dtype)} AR",
                  lossless=unquantized, weights=Weights(quantization=target_quantization))]
    for pair, draft in drafts:
        check_same_tokenizer(target.tokenizer, draft.tokenizer, target.name, draft.name)
        methods.append(draft_model_speculative(
            target, draft, k, max_new_tokens, name=pair.name(dtype), lossless=unquantized,
            weights=Weights(quantization=pair.target, draft_quantization=pair.draft, self_draft=pair.self_draft)))
    return methods


def cllm(base: LoadedModel, cllm_model: LoadedModel | None, max_new_tokens: int, block_size: int,
         init: str = "prompt_tokens", with_ar: bool = True, with_jacobi: bool = True,
         lookahead_configs: Sequence[LookaheadConfig | dict] = (), prompt_lookup_k: int = 0) -> list[Method]:
    """AR on the base model (the baseline and the reference text), Jacobi on the base model
    (lossless) and on the CLLM (a fine-tuned model: its text is its own, not the base's), lookahead
    decoding of the base model (lossless, training-free) with each config, and lookahead decoding of
    the CLLM with the first config (the CLLM paper combines the two: the pool's n-grams come from the
    CLLM's own Jacobi guesses; the findings compare it with the base model's lookahead at that config),
    and with `prompt_lookup_k` > 0 our prompt lookup on the base model (the training-free speculative peer,
    no extra memory)."""
    methods = [ar(base, max_new_tokens, name=BASE_AR)] if with_ar else []
    if with_jacobi:
        methods.append(jacobi_method(base, max_new_tokens, block_size, init, BASE_JACOBI, lossless=True))
    if cllm_model is not None:
        methods.append(jacobi_method(cllm_model, max_new_tokens, block_size, init, CLLM_JACOBI, lossless=False,
                                     weights=CLLM_WEIGHTS))
    methods += [lookahead_method(base, max_new_tokens, config) for config in lookahead_configs]
    if cllm_model is not None and lookahead_configs:
        methods.append(lookahead_method(cllm_model, max_new_tokens, lookahead_configs[0], "CLLM", lossless=False,
                                        weights=CLLM_WEIGHTS))
    if prompt_lookup_k:
        methods.append(prompt_lookup(base, prompt_lookup_k, max_new_tokens))
    return methods


# --- batches: each method's decode takes a batch of prompts and returns one result per prompt ----------

def batched_ar(target: LoadedModel, max_new_tokens: int) -> Method:
    """Our batched AR loop (`batched.generate_ar`): finished rows leave the batch."""
    def decode(batch):
        return batched.generate_ar(target.model, batch, max_new_tokens)
    return Method(BATCHED_AR, decode, lossless=True, role="target AR", engine=engine_of(target.model))


def batched_generate(target: LoadedModel, max_new_tokens: int) -> Method:
    """transformers' greedy `generate` on a left-padded batch: the AR peer (it has no batched speculation)."""
    def decode(batch):
        return hf_peers.generate_batch(target.model, batch, max_new_tokens)
    return Method(BATCHED_GENERATE, decode, lossless=True, role="target AR", implementation="transformers")


def batched_draft(target: LoadedModel, draft: LoadedModel, k: int, max_new_tokens: int) -> Method:
    """Our batched speculative decoder with the draft model at constant k (one batched draft forward a
    drafted position)."""
    check_same_tokenizer(target.tokenizer, draft.tokenizer, target.name, draft.name)

    def decode(batch):
        return batched.generate_speculative(target.model, batched.BatchedDraft(draft.model, k), batch, max_new_tokens)
    return Method(f"draft k={k} (batched)", decode, lossless=True, role="speculative", source=draft_source(k),
                  engine=engine_of(target.model))


def batched_prompt_lookup(target: LoadedModel, k: int, max_new_tokens: int, step_ms=None) -> Method:
    """Our batched speculative decoder with prompt lookup (adaptive, longest match), one source per row.
    `step_ms` (batch size -> {n: ms}, the target's measured batch costs): each step's proposals cut to
    the width the batch's rows pay for (`batched.PerRow`)."""
    cut = step_ms is not None

    def decode(batch):
        source = batched.PerRow(lambda: PromptLookupCandidates(k, max_ngram=PROMPT_LOOKUP_NGRAM), step_ms)
        return batched.generate_speculative(target.model, source, batch, max_new_tokens)
    return Method(f"prompt lookup k={k}{CUT_LABEL if cut else ''} (batched)", decode, lossless=True,
                  role="speculative", source=prompt_lookup_source(k, cost_sized=cut), engine=engine_of(target.model))


def batch_lineup(target: LoadedModel, draft: LoadedModel | None, k_values: Sequence[int], prompt_lookup_k: int,
                 max_new_tokens: int, step_ms=None) -> list[Method]:
    """Batched AR (ours, the baseline; transformers' generate, its peer), the draft model at each k and
    prompt lookup (0: none), all greedy; given the target's batch costs `step_ms`, prompt lookup cut by
    them beside it."""
    methods = [batched_ar(target, max_new_tokens), batched_generate(target, max_new_tokens)]
    if draft is not None:
        methods += [batched_draft(target, draft, k, max_new_tokens) for k in k_values]
    if prompt_lookup_k:
        methods.append(batched_prompt_lookup(target, prompt_lookup_k, max_new_tokens))
        if step_ms is not None:
            methods.append(batched_prompt_lookup(target, prompt_lookup_k, max_new_tokens, step_ms))
    return methods
