"""Vision-language models: a vision tower, a connector, and a decoder reading image and text tokens.

The picture runs through our ViT (CLIP or SigLIP tower: its own maps are kept), the connector turns the
chosen layer's patch vectors into the decoder's width, and those vectors take the places of the image
placeholder tokens in the prompt (the processor has already repeated the placeholder once per image token).
The decoder (our Llama, with its Gemma switches) then runs over every token, image and text.

- LLaVA 1.5: a CLIP tower read at vision_feature_layer (-2: the output of its last-but-one block), its class
  token dropped ("default" strategy) or kept ("full"), then a 2-layer MLP (linear, GELU, linear).
- Idefics3 / SmolVLM: a SigLIP-like tower's normed output per view (tiles and a global view), a pixel shuffle
  (each scale_factor × scale_factor square of patches becomes one vector, their widths side by side) and one
  linear projection without bias; the decoder is causal.
- PaliGemma: a SigLIP tower's normed output, one linear projection, and a prefix-LM mask: the image and the
  prompt attend to each other fully (both ways); later tokens (generated ones) are causal.
- Gemma 3 (kind "gemma3"): a SigLIP tower's normed output, pooled, normed and projected
  (core.vlm_connectors.SoftEmbProjector); each run of image tokens attends to itself both ways in every layer
  (the windowed layers keep their window).
- LLaVA OneVision (kind "llava_onevision"): LLaVA's tower and projector over a base view and the anyres tiles,
  the tiles laid out as one canvas with a learned newline vector after each row (core.vlm_connectors).
- Qwen2.5-VL: its own tower (core.qwen_vision: 2-D RoPE, windowed blocks, the patch merger is the connector)
  and a Qwen2 decoder turned by M-RoPE: (t, h, w) positions, the image tokens' rows and columns on h and w.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_explorer.core.hooks import Hooks
from attn_explorer.core.layers import activation
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.qwen3_vision import Qwen3VisionConfig, Qwen3VisionTower
from attn_explorer.core.qwen_vision import (QwenVisionConfig, QwenVisionTower, mrope_positions, mrope_tables,
                                             patch_positions)
from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.core.vlm_connectors import SoftEmbProjector, anyres_layout, gemma3_masks, pack_anyres


@dataclass
class VLMConfig:
    vision: ViTConfig
    text: LlamaConfig
    kind: str = "llava"  # "llava", "paligemma" or "idefics3": which connector and mask
    image_token_id: int = 32000  # the placeholder the processor repeats, once per image token
    feature_depth: int = 1  # the tower's hidden state read: after this many blocks (LLaVA's vision_feature_layer)
    drop_class_token: bool = True  # LLaVA's "default" select strategy: the tower's class token is not an image token
    projector_act: str = "gelu"  # LLaVA's projector_hidden_act
    projector_bias: bool = True  # LLaVA's multimodal_projector_bias
    prefix_lm: bool = False  # PaliGemma: the prompt (image + text) attends to itself both ways
    scale_factor: int = 1  # Idefics3: the side of the square of patches one image token stands for
    longest_edge: int | None = None  # Idefics3: the picture's longer side before tiling (None: one view)
    text_bos: int | None = None  # the decoder's BOS id (PaliGemma's processor writes it after the image)
    text_eos: int | tuple | None = None  # generation stops here (a tuple: at any of them, e.g. Gemma 3's 1 and 106)
    head: bool = True  # the decoder has an LM head (set from the checkpoint by hub.convert.decoder_head)
    # Qwen2.5-VL (kind "qwen2_5_vl"; vision is a QwenVisionConfig):
    mrope_section: list | None = None  # the decoder's M-RoPE: frequencies per axis (t, h, w), summing to d_k / 2
    mrope_interleaved: bool = False  # Qwen3-VL (kind "qwen3_vl"): the axes' frequencies interleaved
    min_pixels: int = 56 * 56  # the processor's smart_resize bounds (hub.vlm_inputs)
    max_pixels: int = 28 * 28 * 1280
    # Gemma 3 (kind "gemma3"): the tower's patch grid averaged in pool × pool squares (mm_tokens_per_image
    # tokens remain), normed with this epsilon; the image tokens' runs attend to themselves both ways
    pool: int = 1
    soft_emb_eps: float = 1e-6
    boi_token_id: int | None = None  # <start_of_image> and <end_of_image>, around each picture's image tokens
    eoi_token_id: int | None = None
    # LLaVA OneVision (kind "llava_onevision"): image_grid_pinpoints ((height, width) canvases in px) and the
    # anyres_max_N of vision_aspect_ratio (the canvas is shrunk past N tiles' worth of patches)
    grid_pinpoints: list | None = None
    max_tiles: int = 9

    def __post_init__(self):
        if isinstance(self.vision, dict):  # a checkpoint's stored config gives plain objects
            self.vision = {"qwen2_5_vl": QwenVisionConfig, "qwen3_vl": Qwen3VisionConfig}.get(self.kind, ViTConfig)(
                **self.vision)
        if isinstance(self.text, dict):
            self.text = LlamaConfig(**self.text)
        self.text.head = self.head

    # what ModelInfo and the loader read: the decoder's sizes
    @property
    def num_layers(self) -> int:
        return self.text.num_layers

    @property
    def num_heads(self) -> int:
        return self.text.num_heads

    @property
    def dim(self) -> int:
        return self.text.dim

    @property
    def tie_embeddings(self) -> bool:
        return self.text.tie_embeddings

    @property
    def usable_positions(self) -> int:
        return self.text.usable_positions

    @property
    def image_tokens(self) -> int:
        """Image tokens per picture at the tower's own image size (what the processor repeats the placeholder)."""
        n = self.vision.native_grid ** 2 // max(self.scale_factor, self.pool) ** 2
        return n + (self.vision.num_extra_tokens if not self.drop_class_token else 0)

    def layer_kinds(self) -> list[str]:
        kinds = self.text.layer_kinds()
        if self.kind == "gemma3":
            return [f"{k}, image tokens both ways" for k in kinds]
        if self.prefix_lm:
            return [k.replace("global", "global, prompt both ways") for k in kinds]
        return kinds


class VisionLanguage(nn.Module):
    causal = True  # the decoder's text part; a prefix-LM (PaliGemma) opens its prompt both ways

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        cfg.text.head = cfg.head
        D_v, D = cfg.vision.dim, cfg.text.dim
        if cfg.kind == "qwen2_5_vl":  # the tower's merger is the connector
            self.vision = QwenVisionTower(cfg.vision)
        elif cfg.kind == "qwen3_vl":
            self.vision = Qwen3VisionTower(cfg.vision)
        else:
            self.vision = VisionTransformer(cfg.vision)
        if cfg.kind in ("qwen2_5_vl", "qwen3_vl"):
            self.projector = None
        elif cfg.kind == "llava":
            self.projector = nn.ModuleDict(dict(linear_1=nn.Linear(D_v, D, bias=cfg.projector_bias),
                                                linear_2=nn.Linear(D, D, bias=cfg.projector_bias)))
        elif cfg.kind == "idefics3":
            self.projector = nn.ModuleDict(dict(proj=nn.Linear(D_v * cfg.scale_factor ** 2, D, bias=False)))
        elif cfg.kind == "gemma3":
            self.projector = SoftEmbProjector(cfg.vision.native_grid, cfg.pool, D_v, D, cfg.soft_emb_eps)
        elif cfg.kind == "llava_onevision":
            self.projector = nn.ModuleDict(dict(linear_1=nn.Linear(D_v, D, bias=cfg.projector_bias),
                                                linear_2=nn.Linear(D, D, bias=cfg.projector_bias)))
            self.image_newline = nn.Parameter(torch.zeros(D))
        else:
            self.projector = nn.ModuleDict(dict(linear=nn.Linear(D_v, D)))
        self.language = Llama(cfg.text)

    # the decoder's parts under the names the API reads (hooks, W_O, generation)
    @property
    def blocks(self):
        return self.language.blocks

    @property
    def embed_tokens(self):
        return self.language.embed_tokens

    @property
    def norm(self):
        return self.language.norm

    @property
    def can_generate(self) -> bool:
        return self.language.can_generate

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language.logits(hidden)

    def new_cache(self):
        return self.language.new_cache()

    def image_features(self, pixels: torch.Tensor, dk_scale: float = 1.0, output_attentions: bool = False,
                       image_size: tuple[int, int] | None = None):
        """pixels (T, C, H, W) -> (the decoder-width vectors (T, n, D), the tower's maps (T, L_v, H_v, P, P) or
        None, the patch grid (rows, cols)). The tower runs every block (its maps are all kept); the
        connector reads the hidden state after cfg.feature_depth blocks."""
        cfg = self.cfg
        if cfg.kind in ("qwen2_5_vl", "qwen3_vl"):  # pixels: (patches, grid (t, h, w)); maps (1, L_v, H_v, P, P)
            patches, grid = pixels
            out = self.vision(patches, grid, dk_scale=dk_scale, output_attentions=output_attentions)
            maps = None
            if out.attentions is not None:  # the processor's merge-block-major order -> patches row by row
                pos = patch_positions(grid, cfg.vision.merge).to(patches.device)
                order = torch.argsort(pos[:, 0] * grid[2] + pos[:, 1])
                maps = out.attentions[:, :, order][..., order][None]
            self._deepstack = getattr(out, "deepstack", None)  # Qwen3-VL: read once by forward
            return out.hidden[None], maps, (grid[1], grid[2])
        depth = cfg.feature_depth
        got: dict = {}

        def grab(x, _name):
            got["x"] = x

        point = "hook_embed" if depth == 0 else f"blocks.{depth - 1}.hook_resid_post"
        last = depth == cfg.vision.num_layers and cfg.kind not in ("llava", "llava_onevision")  # SigLIP's normed output
        out = self.vision(pixels, dk_scale=dk_scale, output_attentions=output_attentions,
                          hooks=None if last else Hooks({point: (grab,)}))
        x = out.hidden if last else got["x"]
        if cfg.drop_class_token:
            x = x[:, cfg.vision.num_extra_tokens:]
        p = self.projector
        if cfg.kind in ("llava", "llava_onevision"):
            x = p["linear_2"](activation(cfg.projector_act)(p["linear_1"](x)))
            if cfg.kind == "llava_onevision":  # (image_size: the picture's (height, width) before any resize)
                v = cfg.vision
                layout = anyres_layout(image_size, cfg.grid_pinpoints, v.image_size, v.native_grid, cfg.max_tiles)
                x = pack_anyres(x, layout, self.image_newline)[None]
        elif cfg.kind == "gemma3":
            x = p(x)
        elif cfg.kind == "idefics3":
            x = p["proj"](pixel_shuffle(x, out.grid, cfg.scale_factor))
        else:
            x = p["linear"](x)
        return x, out.attentions, out.grid

    def forward(self, input_ids: torch.Tensor, pixels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, dk_scale: float = 1.0, dk_layers=None,
                output_attentions: bool = False, hooks: Hooks | None = None, cache=None, prefix_len=None,
                vision_maps: bool | None = None, image_size: tuple[int, int] | None = None, **_) -> ModelOutput:
        """input_ids (1, N) with the placeholder repeated once per image token; pixels (T, C, H, W), one row per
        picture or tile. prefix_len (PaliGemma): the tokens of the prompt, which see each other both ways.
        vision_maps: whether the tower keeps its maps (None: as output_attentions; a lazy decoder may still want them).
        image_size (LLaVA OneVision): the picture's (height, width) in px, which sets its anyres canvas.
        Returns the decoder's output with `vision_attentions` and the patch grid."""
        cfg = self.cfg
        text_ids = input_ids
        if cfg.image_token_id >= cfg.text.vocab_size:  # Gemma 3: an image id past the vocabulary embeds as id 0
            text_ids = input_ids.masked_fill(input_ids == cfg.image_token_id, 0)
        x = self.language.embed(text_ids)
        vision_attn, grid = None, None
        if pixels is not None:
            feats, vision_attn, grid = self.image_features(pixels, dk_scale,
                                                           output_attentions if vision_maps is None else vision_maps,
                                                           image_size)
            place = input_ids == cfg.image_token_id
            if int(place.sum()) != feats.shape[0] * feats.shape[1]:
                raise ValueError(f"{int(place.sum())} image placeholder tokens for {feats.shape[0] * feats.shape[1]} "
                                 "image vectors")
            x = x.masked_scatter(place[..., None], feats.to(x.dtype))
        attend = attend_local = None
        if cfg.kind == "gemma3" and pixels is not None:  # the prompt's image runs both ways (a prompt, no cache yet)
            if cache is not None and cache.length:
                raise ValueError("gemma3: a picture goes with the prompt, not after cached tokens")
            windows = [w for w in cfg.text.sliding_windows or [] if w]
            if len(set(windows)) > 1:
                raise ValueError("gemma3: one sliding window for every local layer")
            attend, attend_local = gemma3_masks(input_ids == cfg.image_token_id, windows[0] if windows else None)
        if cfg.prefix_lm and prefix_len:
            N = input_ids.shape[1]
            past = 0 if cache is None else cache.length
            q = torch.arange(past, past + N, device=x.device)[:, None]
            k = torch.arange(past + N, device=x.device)[None, :]
            attend = ((k <= q) | ((k < prefix_len) & (q < prefix_len)))[None, None]
        rope = self.mrope(input_ids, grid, cache) if cfg.kind in ("qwen2_5_vl", "qwen3_vl") else None  # patch grid
        if cfg.kind == "qwen3_vl" and pixels is not None:
            hooks = self.deepstack_hooks(input_ids == cfg.image_token_id, hooks)
        out = self.language(input_ids, attention_mask, dk_scale=dk_scale, dk_layers=dk_layers,
                            output_attentions=output_attentions, hooks=hooks, cache=cache, embeds=x, attend=attend,
                            rope=rope, **({"attend_local": attend_local} if attend_local is not None else {}))
        out.vision_attentions = vision_attn
        out.grid = grid
        return out

    def mrope(self, input_ids: torch.Tensor, grid, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen2.5-VL's M-RoPE (cos, sin) for these tokens. A prompt (no cache, or an empty one) gets its (t, h, w)
        positions (core.qwen_vision.mrope_positions; the picture's merged grid); tokens after it, in a cache,
        sit at their index plus the prompt's delta on all three axes."""
        cfg = self.cfg
        N = input_ids.shape[1]
        past = 0 if cache is None else cache.length
        if past == 0:
            merged = [(grid[0] // cfg.vision.merge, grid[1] // cfg.vision.merge)] if grid else []
            pos, delta = mrope_positions(input_ids[0].tolist(), cfg.image_token_id, merged)
            if cache is not None:
                cache.mrope_delta = delta
        else:
            start = past + getattr(cache, "mrope_delta", 0)
            pos = torch.arange(start, start + N).expand(3, -1)
        t = cfg.text
        return mrope_tables(pos.to(input_ids.device), t.head_dim, t.rope_theta, cfg.mrope_section,
                            self.language.embed_tokens.weight.dtype, cfg.mrope_interleaved)

    def deepstack_hooks(self, place: torch.Tensor, hooks: Hooks | None) -> Hooks:
        """Qwen3-VL's DeepStack: after decoder layer i (i < the tower's DeepStack mergers), the i-th merger's vectors
        are added to the stream at the image tokens, before any of the caller's hooks on blocks.{i}.hook_resid_post
        (which then see the sum, as the next layer does). The caller's lazy keep and kept stores are carried."""
        feats, self._deepstack = getattr(self, "_deepstack", None) or [], None
        fns = dict(hooks.fns) if hooks is not None else {}
        for i, f in enumerate(feats):
            def add(x, _name, f=f):
                x = x.clone()
                x[place] = x[place] + f.to(x.dtype)
                return x
            name = f"blocks.{i}.hook_resid_post"
            fns[name] = (add, *fns.get(name, ()))
        if hooks is None:
            return Hooks(fns)
        return Hooks(fns, keep=hooks.keep, kept=hooks.kept)


def pixel_shuffle(x: torch.Tensor, grid: tuple[int, int], s: int) -> torch.Tensor:
    """(T, rows*cols, D) patch vectors -> (T, rows*cols / s², D·s²): each s × s square of patches as one vector,
    squares row by row. Within a vector the square's rows come one after another, each row's patches side by
    side (Idefics3's order)."""
    T, _, D = x.shape
    rows, cols = grid
    x = x.reshape(T, rows // s, s, cols // s, s, D)  # (T, R, dr, C, dc, D)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(T, (rows // s) * (cols // s), s * s * D)
