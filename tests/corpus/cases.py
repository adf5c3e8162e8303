"""The corpus: every hostile input, what the user must see for it, and how each front end is fed it.

A `Case` names files built by make_cases.py as "{name}". Each bad case is fed to
- the CLI: `export <cli args> --out <folder>/x.npz` (unless it sets --out itself),
- the API: `api` says how (load a model, run text or an image, read a text file); None where the API has
  no such input (the CLI's own options),
- the GUI: `gui` says how (load a model, open an image, open a text file, type text, export); None where
  the window cannot produce the input (its sliders stop at sane values).
`expect` is a piece of the one line the user sees, the same on every front end.
"""
from __future__ import annotations

from dataclasses import dataclass

TEXT = "The animal didn't cross the street because it was too tired."


@dataclass(frozen=True)
class Case:
    id: str
    cli: tuple[str, ...]
    expect: str
    api: tuple | None = None  # ("load", src) | ("text", text, kw) | ("image", src, kw) | ("read", path)
    gui: tuple | None = None  # ("load", src) | ("image", src) | ("textfile", path) | ("type", text) | ("export", path)
    api_expect: str | None = None  # where the API's words differ (it has no --options)
    gui_expect: str | None = None  # where the window's words differ (it exports .svg too)


def _model(name: str, expect: str, gui: bool = True) -> Case:
    src = "{" + name + "}"
    return Case(name, ("--model", src, "--text", TEXT), expect, ("load", src), ("load", src) if gui else None)


MODELS = [
    _model("empty_folder", "it has no config.json"),
    _model("config_list", "config.json must be a JSON object"),
    _model("config_string", "config.json must be a JSON object"),
    _model("config_not_json", "not valid JSON"),
    _model("config_latin1", "not valid JSON"),
    _model("config_no_type", "config.json has no model_type"),
    _model("config_unsupported", "unsupported architecture 't5'"),
    _model("config_missing_field", "missing field 'intermediate_size'"),
    _model("heads_zero", "num_attention_heads must be a whole number >= 1, got 0"),
    _model("heads_not_dividing", "hidden_size 8 is not divisible by num_attention_heads 3"),
    _model("heads_negative", "num_attention_heads must be a whole number >= 1, got -2"),
    _model("width_string", "hidden_size must be a whole number >= 1, got 'eight'"),
    _model("layers_float", "num_hidden_layers must be a whole number >= 1, got 1.5"),
    _model("activation_unknown", "activation 'swish9' is not supported"),
    _model("eps_string", "layer_norm_eps must be a finite number"),
    _model("int_weights", "holds int32; weights must be floating-point"),
    _model("bool_weights", "holds bool; weights must be floating-point"),
    _model("shape_mismatch", "shape mismatch"),
    _model("weights_truncated", "the weights file is corrupt or unreadable"),
    _model("weights_garbage", "the weights file is corrupt or unreadable"),
    _model("weights_missing", "no model.safetensors or pytorch_model.bin"),
    _model("weights_fifo", "the weights file is not a regular file"),
    _model("config_fifo", "the config is not a regular file"),
    _model("config_folder", "the config is not a regular file (a folder)"),
    _model("ckpt_config_not_json", "the stored config is not valid JSON"),
    _model("ckpt_config_list", "the stored config must be a JSON object, not a list"),
    _model("ckpt_unknown_field", "unknown config field 'colour'"),
    _model("ckpt_no_config", "no config stored in the checkpoint"),
    _model("ckpt_heads_zero", "num_heads must be a whole number >= 1, got 0"),
    _model("ckpt_wrong_tensors", "checkpoint does not match its config"),
    _model("ckpt_bad_family", "unsupported family 'llama'"),
    _model("ckpt_huge", "would need 349 GB"),
    _model("ckpt_foreign", "was not saved by attn-explorer"),
    _model("ckpt_empty", "is not a readable .safetensors file"),
    _model("ckpt_fifo", "the checkpoint is not a regular file"),
    _model("ckpt_text", "is not a readable .safetensors file"),
    _model("not_a_model_file", "is neither a model folder nor a .safetensors checkpoint"),
    Case("model_missing_path", ("--model", "./no/such/model", "--text", TEXT), "not found",
         ("load", "./no/such/model"), ("load", "./no/such/model")),
    Case("model_blank_name", ("--model", "   ", "--text", TEXT), "no model given", ("load", "   ")),
]


def _image(name: str, expect: str) -> Case:
    src = "{" + name + "}"
    return Case(name, ("--model", "textbook-vit", "--image", src), expect, ("image", src, {}), ("image", src))


IMAGES = [
    _image("truncated_jpg", "could not be read as an image"),
    _image("zero_png", "is not an image file this app can read"),
    _image("text_png", "is not an image file this app can read"),
    _image("huge_png", "100000×100000 pixels"),
    _image("garbage_jpg", "could not be read as an image"),
    _image("image_folder", "is a folder, not an image file"),
    _image("image_fifo", "is not a regular file"),
    _image("image_missing", "image file not found"),
    Case("image_to_text_model", ("--model", "minilm", "--image", "{good_jpg}"), "minilm is a text model"),
    Case("text_to_image_model", ("--model", "textbook-vit", "--text", TEXT), "is an image model; use --image"),
]

TEXTS = [
    # the window's text box may be cleared on the way to new words: an empty box keeps the view, quietly
    Case("text_empty", ("--text", ""), "the text is empty", ("text", "", {}), ("type-quiet", "")),
    Case("text_spaces", ("--text", "   \n\t "), "the text is empty", ("text", "   \n\t ", {}), ("type-quiet", "   \n\t ")),
    Case("text_nul_only", ("--text", "\x00\x00\x00"), "the text is empty", ("text", "\x00\x00\x00", {}),
         ("type", "\x00\x00\x00")),
    Case("text_zero_width", ("--text", "\u200b\u200d\ufeff"), "the text is empty", ("text", "\u200b\u200d\ufeff", {}),
         ("type", "\u200b\u200d\ufeff")),
    # the window cuts a text file of any size to what its model reads (issue 16); this one holds only NULs
    Case("textfile_huge", ("--text-file", "{huge_txt}"), "huge.txt is larger than", ("read", "{huge_txt}"),
         ("textfile", "{huge_txt}"), gui_expect="huge.txt is empty where it would be read"),
    Case("text_huge", ("--text", "word " * 1_000_000), "the text is larger than",
         ("text", "word " * 1_000_000, {})),  # 5 MB typed; the window's text box is not fed 5 MB here
    Case("textfile_invalid_utf8", ("--text-file", "{invalid_utf8_txt}"), "is not UTF-8 text",
         ("read", "{invalid_utf8_txt}"), ("textfile", "{invalid_utf8_txt}")),
    Case("textfile_latin1", ("--text-file", "{latin1_txt}"), "is not UTF-8 text", ("read", "{latin1_txt}"),
         ("textfile", "{latin1_txt}")),
    Case("textfile_utf16", ("--text-file", "{utf16_txt}"), "is not UTF-8 text", ("read", "{utf16_txt}"),
         ("textfile", "{utf16_txt}")),
    Case("textfile_nul_only", ("--text-file", "{nul_txt}"), "is empty", ("read", "{nul_txt}"),
         ("textfile", "{nul_txt}")),
    Case("textfile_empty", ("--text-file", "{empty_txt}"), "is empty", ("read", "{empty_txt}"),
         ("textfile", "{empty_txt}")),
    Case("textfile_folder", ("--text-file", "{text_folder}"), "is a folder", ("read", "{text_folder}"),
         ("textfile", "{text_folder}")),
    Case("textfile_fifo", ("--text-file", "{text_fifo}"), "is not a regular file", ("read", "{text_fifo}"),
         ("textfile", "{text_fifo}")),
    Case("textfile_missing", ("--text-file", "{text_missing}"), "not found", ("read", "{text_missing}"),
         ("textfile", "{text_missing}")),
]


def _number(option: str, value: str, expect: str, api: tuple | None, api_expect: str | None = None) -> Case:
    image = option == "--image-size"
    base = ("--model", "textbook-vit", "--image", "{good_jpg}") if image else ("--text", TEXT)
    return Case(f"{option[2:]}={value}", base + (option, value), expect, api, api_expect=api_expect)


NUMBERS = [
    _number("--dk-scale", v, "dk-scale must be", ("text", TEXT, {"dk_scale": float(v)}))
    for v in ("0", "-1", "nan", "inf", "1e300")
] + [
    _number("--dk-scale", "abc", "dk-scale must be a positive number", ("text", TEXT, {"dk_scale": "abc"})),
    _number("--max-tokens", "0", "max-tokens must be a positive integer", ("text", TEXT, {"max_tokens": 0})),
    _number("--max-tokens", "-3", "max-tokens must be a positive integer", ("text", TEXT, {"max_tokens": -3})),
    _number("--max-tokens", "1.5", "max-tokens must be a positive integer", ("text", TEXT, {"max_tokens": 1.5})),
    _number("--max-tokens", "2", "must be at least 3 for minilm", ("text", TEXT, {"max_tokens": 2})),
    _number("--image-size", "0", "image-size must be a positive integer", ("image", "{good_jpg}", {"image_size": 0}),
            "image_size must be at least one patch (16 px), got 0"),
    _number("--image-size", "7", "must be at least one patch (16 px)", ("image", "{good_jpg}", {"image_size": 7})),
    _number("--image-size", "100000", "too large (at most 2048 px)",
            ("image", "{good_jpg}", {"image_size": 100000})),
]

OUTPUTS = [
    Case("out_is_a_folder", ("--text", TEXT, "--out", "{root}/out/taken.npz"), "is a folder",
         gui=("export", "{root}/out/taken.npz")),
    Case("out_missing_parent", ("--text", TEXT, "--out", "{root}/out/no/such/x.npz"), "does not exist",
         gui=("export", "{root}/out/no/such/x.npz")),
    Case("out_unknown_suffix", ("--text", TEXT, "--out", "{root}/out/x.docx"), "must end in",
         gui=("export", "{root}/out/x.docx"), gui_expect="unknown export format '.docx'"),
    Case("out_no_suffix", ("--text", TEXT, "--out", "{root}/out/attention"), "must end in",
         gui=("export", "{root}/out/attention"), gui_expect="unknown export format ''"),
]

BAD = MODELS + IMAGES + TEXTS + NUMBERS + OUTPUTS

# Pictures that look hostile but must work: each becomes an RGB input of the model's size.
GOOD_IMAGES = ["one_pixel", "sixteen_bit", "cmyk_jpg", "palette_alpha", "animated_gif", "wide_strip"]
