"""The explorer (notebooks/00_explore.ipynb): any prompt through any of the kit's methods, in JupyterLab,
with the models loaded once.

    explorer = Explorer.load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct")
    explorer.run("Write a function that reverses a list.", Settings("hybrid", k=5))   # from code
    ui = ExplorerUI(explorer); ui                                                       # with widgets

Each run decodes the prompt with the chosen method and with AR of the same target, once each (a
look, not a benchmark: the notebooks measure speed with warm-ups, repeats and intervals). It shows the
text coloured by where each token came from (`token_view`), tokens per target forward, time per token
against AR's on the same prompt, and agreement with AR's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specdec_lab import data, models, quality, token_view
from specdec_lab.experiments import lineups
from specdec_lab.method import LookaheadConfig, Method, SuffixSettings, TreeSettings
from specdec_lab.models import LoadedModel
from specdec_lab.cllm.train import FINAL
from specdec_lab.result import GenerationResult
from specdec_lab.runs.paths import results_path
from specdec_lab.sampling import GREEDY, Sampling

AR = "AR"
DRAFT = "speculative (draft model)"
DRAFT_TREE = "draft tree"
LOOKUP = "prompt lookup"
SUFFIX = "suffix decoding"
HYBRID = "hybrid"
LOOKAHEAD = "lookahead"
JACOBI = "Jacobi"
CLLM_JACOBI = "Jacobi on the CLLM"
NEEDS_DRAFT = (DRAFT, DRAFT_TREE, HYBRID)
GREEDY_ONLY = (LOOKAHEAD, JACOBI, CLLM_JACOBI)  # Jacobi and lookahead decoding are greedy
HYBRID_COST_RATIO = 0.3  # the draft's step over the target's, assumed (02 measures it)
SUFFIX_SPEC_FACTOR = 4.0  # suffix decoding's proposal limit over its match length: the CPU profiles' (02 replays it)


@dataclass(frozen=True)
class Settings:
    """One run's choices. `k`: the draft length, prompt lookup's proposal, a tree's depth, lookahead's
    window; `tree_nodes`: a draft tree's or a suffix tree's size; `block_size`: Jacobi's block."""

    method: str = AR
    k: int = 5
    tree_nodes: int = 8
    temperature: float = 0.0
    max_new_tokens: int = 64
    block_size: int = 16
    seed: int = 0

    @property
    def sampling(self) -> Sampling:
        return GREEDY if self.temperature == 0 else Sampling(temperature=self.temperature, seed=self.seed)


@dataclass
class Exploration:
    """What one run produced: the method's result and AR's on the same prompt."""

    settings: Settings
    method: Method
    result: GenerationResult
    ar: GenerationResult
    pieces_of: object  # tokenizer, to show the text

    @property
    def ms_per_token_ratio(self) -> float:
        """AR's time per generated token over the method's (> 1: the method was faster, this once)."""
        return (self.ar.wall_time_s / self.ar.num_tokens) / (self.result.wall_time_s / self.result.num_tokens)

    @property
    def same_tokens(self) -> int:
        return quality.common_prefix_length(self.ar.tokens, self.result.tokens)

    def summary(self) -> str:
        forwards = (f"{self.result.tokens_per_target_forward:.2f} tokens per target forward"
                    if self.result.target_forwards else "no target forward")
        if self.settings.sampling.greedy:
            agreement = ("the same text as AR" if self.same_tokens == len(self.ar.tokens) == len(self.result.tokens)
                         else f"parts from AR's text at token {self.same_tokens + 1}")
        else:
            agreement = "sampled: one sample each, so the texts may differ (the notebooks check the distribution)"
        return (f"{self.method.name}: {self.result.num_tokens} tokens, {forwards}; per-token speed "
                f"{self.ms_per_token_ratio:.2f}x AR's on this prompt (AR's time per token over its; one run each, "
                f"not a benchmark); {agreement}")

    def view(self) -> token_view.TokenViews:
        return token_view.TokenViews(self.summary(), [
            token_view.TokenText.of(self.method.short_label, self.result, self.pieces_of),
            token_view.TokenText.of("AR", self.ar, self.pieces_of)])

    def _repr_html_(self) -> str:
        return self.view().html()

    def __repr__(self) -> str:
        return self.summary()


def latest_cllm(results_dir: str = "results/cpu") -> str | None:
    """The newest CLLM notebook 04 trained under `results_dir` (its `final` folder), or None."""
    finals = sorted(results_path(results_dir, "04_cllm", "runs").glob(f"cllm-*/{FINAL}"), key=lambda p: p.stat().st_mtime)
    return str(finals[-1]) if finals else None


@dataclass
class Explorer:
    target: LoadedModel
    draft: LoadedModel | None = None
    cllm: LoadedModel | None = None
    _ar_results: dict = field(default_factory=dict, repr=False)
    # suffix decoding keeps its earlier answers: one method per setting, reused from run to run
    _suffix_methods: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, target: str, draft: str | None = None, cllm: str | None = None, dtype: str = "auto",
             device: str = "cpu", cllm_required: bool = True) -> "Explorer":
        """Load the models once (a zoo name, hub id or folder each; `cllm`: a folder notebook 04 trained
        from the target). Says what it loaded and the weights' memory. A CLLM trained from another model
        is refused, or left out with a note when not `cllm_required` (the newest one found, say)."""
        loaded = {}
        for role, spec in (("target", target), ("draft", draft), ("cllm", cllm)):
            if spec:
                # a CLLM is a fine-tuned model: its own dtype, not a path chosen for the target. The target
                # verifies (speculation, lookahead, Jacobi): with 'auto', the path fastest at multi-token forwards
                loaded[role] = models.load(spec, dtype="float32" if role == "cllm" and dtype == "auto" else dtype,
                                           device=device, multi_token=role == "target")
        if "draft" in loaded:
            models.check_same_tokenizer(loaded["target"].tokenizer, loaded["draft"].tokenizer, target, draft)
        if "cllm" in loaded and loaded["cllm"].tokenizer.get_vocab() != loaded["target"].tokenizer.get_vocab():
            problem = (f"the CLLM at {cllm} was trained from another model than the target {target!r} (their "
                       "tokenizers differ): set target to the CLLM's base model (notebook 04's `model`), or leave the CLLM out")
            if cllm_required:
                raise ValueError(problem)
            print(f"CLLM left out: {problem}")
            del loaded["cllm"]
        for role, model in loaded.items():
            spec = {"target": target, "draft": draft, "cllm": cllm}[role]
            print(f"{role}: {spec} ({model.precision}), {model.weight_bytes / 2**20:,.0f} MB of weights")
        return cls(loaded["target"], loaded.get("draft"), loaded.get("cllm"))

    @property
    def methods(self) -> list[str]:
        """The methods these models can run."""
        return [AR, *((DRAFT, DRAFT_TREE) if self.draft else ()), LOOKUP, SUFFIX, *((HYBRID,) if self.draft else ()),
                LOOKAHEAD, JACOBI, *((CLLM_JACOBI,) if self.cllm else ())]

    def method(self, settings: Settings) -> Method:
        """The line-up's record for the chosen method, as the notebooks run it."""
        name, k, new, sampling = settings.method, settings.k, settings.max_new_tokens, settings.sampling
        if name not in self.methods:
            raise ValueError(f"method {name!r} is not available here: choose one of {self.methods}"
                             + (" (load a draft model for the draft methods)" if name in NEEDS_DRAFT else "")
                             + (" (load a CLLM folder that notebook 04 trained)" if name == CLLM_JACOBI else ""))
        if name in GREEDY_ONLY and not sampling.greedy:
            raise ValueError(f"{name} decodes greedily: set temperature 0 (got {settings.temperature})")
        for what, value, least in (("k", k, 1), ("tree_nodes", settings.tree_nodes, 1),
                                   ("max_new_tokens", new, 1), ("block_size", settings.block_size, 1)):
            if value < least:
                raise ValueError(f"{what} must be >= {least}, got {value}")
        target, draft = self.target, self.draft
        if name == AR:
            return lineups.ar(target, new, sampling)
        if name == DRAFT:
            return lineups.draft_model_speculative(target, draft, k, new, sampling)
        if name == DRAFT_TREE:
            return lineups.draft_tree(target, draft, k, TreeSettings(settings.tree_nodes, branching=3, beam=4), new,
                                      sampling)
        if name == LOOKUP:
            return lineups.prompt_lookup(target, k, new, sampling)
        if name == SUFFIX:  # its tree of earlier answers grows with every run
            key = (settings.tree_nodes, new, settings.temperature, settings.seed)
            if key not in self._suffix_methods:
                self._suffix_methods[key] = lineups.suffix_decoding(target, settings.tree_nodes, True,
                                                                    SuffixSettings(spec_factor=SUFFIX_SPEC_FACTOR), new, sampling)
            return self._suffix_methods[key]
        if name == HYBRID:
            return lineups.hybrid(target, draft, k, 2 * k, new, HYBRID_COST_RATIO, sampling)
        if name == LOOKAHEAD:
            return lineups.lookahead_method(target, new, LookaheadConfig(window=k, ngram_size=3))
        if name == JACOBI:
            return lineups.jacobi_method(target, new, settings.block_size, "prompt_tokens", JACOBI, lossless=True)
        return lineups.jacobi_method(self.cllm, new, settings.block_size, "prompt_tokens", CLLM_JACOBI,
                                     lossless=False, weights=lineups.CLLM_WEIGHTS)

    def run(self, prompt: str | data.Prompt | list[int], settings: Settings = Settings()) -> Exploration:
        method = self.method(settings)
        prompt_ids = self.encode(prompt)
        key = (tuple(prompt_ids), settings.max_new_tokens, settings.temperature, settings.seed)
        if key not in self._ar_results:  # AR of the same prompt, once per prompt and settings (first: it warms up)
            self._ar_results[key] = self.method(replace(settings, method=AR))(prompt_ids)
        result = method(prompt_ids)
        return Exploration(settings, method, result, self._ar_results[key], self.target.tokenizer)

    def encode(self, prompt: str | data.Prompt | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty: type a prompt, or pick one from a prompt set")
            prompt = data.Prompt("typed", "typed", prompt)
        return data.encode(self.target.tokenizer, prompt)


class ExplorerUI:
    """ipywidgets over an `Explorer`: a prompt (typed, or picked from a prompt set), the method and its
    settings, a Run button, and the result below. Code drives it as a reader would:
    `ui.method.value = "hybrid"; ui.run_button.click()`."""

    def __init__(self, explorer: Explorer, prompt_sets: tuple[str, ...] = ("humaneval", "mtbench", "xsum", "nq-open", "asdiv"),
                 per_set: int = 3):
        import ipywidgets as widgets

        self.explorer = explorer
        self.prompts = {f"{p.category}: {p.id}": p for name in prompt_sets
                        for p in _prompts_or_none(name, per_set)}
        self.picked = widgets.Dropdown(options=["(the text below)", *self.prompts], description="prompt")
        self.text = widgets.Textarea(value="Write a Python function that returns the n-th Fibonacci number.",
                                     layout=widgets.Layout(width="90%", height="80px"))
        self.method = widgets.Dropdown(options=explorer.methods, value=AR, description="method")
        self.k = widgets.IntSlider(5, 1, 16, description="k / window")
        self.tree_nodes = widgets.IntSlider(8, 2, 32, description="tree nodes")
        self.temperature = widgets.FloatSlider(0.0, min=0.0, max=1.5, step=0.1, description="temperature")
        self.max_new_tokens = widgets.IntSlider(64, 8, 256, step=8, description="max tokens")
        self.run_button = widgets.Button(description="Run", button_style="primary")
        self.output = widgets.Output()
        self.last: Exploration | None = None
        self.run_button.on_click(lambda _: self.run())
        self.box = widgets.VBox([self.picked, self.text, widgets.HBox([self.method, self.k, self.tree_nodes]),
                                 widgets.HBox([self.temperature, self.max_new_tokens, self.run_button]), self.output])

    def settings(self) -> Settings:
        return Settings(self.method.value, self.k.value, self.tree_nodes.value, self.temperature.value,
                        self.max_new_tokens.value)

    def run(self) -> Exploration | None:
        from IPython.display import HTML, display

        prompt = self.prompts.get(self.picked.value, self.text.value)
        self.output.clear_output()
        with self.output:
            try:
                self.last = self.explorer.run(prompt, self.settings())
            except ValueError as error:  # a bad choice: say what to change, keep the UI
                self.last = None
                display(HTML(f"<b>Cannot run:</b> {error}"))
                return None
            display(self.last)
        return self.last

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs)


def _prompts_or_none(name: str, per_set: int) -> list[data.Prompt]:
    """A prompt set's first prompts; none where its data is not there (offline, not yet downloaded)."""
    try:
        return data.load_prompts(name, per_set)
    except (OSError, ValueError) as error:
        print(f"prompt set {name!r} left out: {error}")
        return []
