"""The Generate page: a decoder writes after a prompt, one token at a time, and every step shows

- the next-token probabilities as bars (the most likely first, at the current temperature);
- the growing attention: the newest token's row in every head (one image row per layer × head, one
  column per token so far, so each new token adds a column), or one head's rows of every step (a
  triangle that grows by a row and a column per token);
- the attention sink: how much of the attention goes to the first token, averaged over every layer
  and head, step by step.

Only decoders generate; for an encoder the page says so and offers to load smollm2-135m. The page
only draws and forwards intent: the generation runs in session/generation.py.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QSizePolicy, QSlider, QSpinBox, QSplitter, QStackedWidget, QVBoxLayout, QWidget)

from attn_explorer.gui.generate.vlm_panel import HINT as VLM_HINT, VlmGenerationPanel, weights_words
from attn_explorer.gui.widgets.tokens import token_text
from attn_explorer.session.generation import SUGGESTED_MODEL, GenerationSession

TEMPERATURE_STEPS = 40  # the slider: 0 .. 2 in steps of 0.05
MODES = ("all heads: newest row", "one head: every step")
BARS = 10
BARS_TITLE = "next token"
SINK_TITLE = "share on token 0"
EMPTY_HINT = ("Press Generate: for every new token this shows the model's next-token probabilities, the "
              "new token's attention over every token so far, and how much of that attention lands on the "
              "first token.")


def temperature_words(t: float) -> str:
    """The one wording of a temperature, on the slider and in the titles: 0 is greedy."""
    return "greedy" if t == 0 else f"T = {t:.2f}"


class _PageLayout(QVBoxLayout):
    """Keeps its wrapped labels' height-for-width to itself, so a scroll area fits the page to the window
    instead of sizing it by the labels' height at a narrow width (as the Cost page does)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return False


def _plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
    w = pg.PlotWidget(background="w")
    w.setTitle(title, color="k", size="9pt")
    w.setLabel("left", left)
    w.setLabel("bottom", bottom)
    w.setMenuEnabled(False)
    w.hideButtons()
    w.setMinimumSize(160, 90)
    for side in ("left", "bottom"):
        w.getAxis(side).enableAutoSIPrefix(False)  # probabilities read as 0.4, not 400 × 0.001
    return w


class GeneratePage(QWidget):
    def __init__(self, state: Any, session: GenerationSession | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.session = session or GenerationSession(state, parent=self)

        # --- the notice for encoders (hidden for decoders)
        self.notice = QLabel("")
        self.notice.setWordWrap(True)
        self.load_button = QPushButton(f"Load {SUGGESTED_MODEL}")
        self.load_button.clicked.connect(lambda: state.load_model(SUGGESTED_MODEL, want_image=False))

        # --- controls
        self.prompt = QLineEdit("What is the capital of France?")
        self.prompt.setPlaceholderText("a prompt for the model to continue")
        self.prompt.returnPressed.connect(self.generate)
        self.chat = QCheckBox("chat")
        self.chat.setToolTip("wrap the prompt in the model's chat template, as one user message")
        self.temperature = QSlider(Qt.Horizontal)
        self.temperature.setRange(0, TEMPERATURE_STEPS)
        self.temperature.setValue(0)
        self.temperature.setFixedWidth(90)
        self.temperature_label = QLabel("")
        self.temperature.valueChanged.connect(self._temperature_changed)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 512)
        self.max_tokens.setValue(24)
        self.max_tokens.setPrefix("max ")
        self.generate_button = QPushButton("Generate")
        self.generate_button.clicked.connect(self.generate)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(lambda: self.session.stop())  # clicked(bool) would fill `report`

        # --- output
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setMaximumHeight(60)
        self.status = QLabel("")
        self.status.setStyleSheet("font-family: monospace;")

        # --- plots
        self.bars_plot = _plot(BARS_TITLE, "token", "probability")
        self.bars_plot.setToolTip("the ten most likely next tokens. Greedy (temperature 0) takes the top one; the "
                                  "bars are then softmax(logits). Above 0 they are softmax(logits / T), sampled from")
        self.bars_plot.getViewBox().invertY(True)
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.7, width=[], brush=(70, 110, 190))
        self.bars_plot.addItem(self.bars)
        self.attn_plot = _plot("", "layer × head", "key token")
        self.attn_plot.setToolTip("colour runs up to the largest weight off the first token, so the first "
                                  "column (the attention sink) saturates; its share is plotted on the left")
        self.attn_plot.getViewBox().invertY(True)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("viridis"))
        self.attn_plot.addItem(self.image)
        self.mode = QComboBox()
        self.mode.addItems(MODES)
        self.layer = QSpinBox()
        self.layer.setPrefix("layer ")
        self.head = QSpinBox()
        self.head.setPrefix("head ")
        for w in (self.mode, self.layer, self.head):
            (w.currentIndexChanged if w is self.mode else w.valueChanged).connect(self._draw_attention)
        # a vision-language model (issue 26 B): each new word's attention drawn on the picture, in the attention
        # plot's place
        self.vlm = VlmGenerationPanel(lambda: (self.layer.value(), self.head.value()),
                                      lambda: (state.alpha, state.colormap))
        self.vlm.hide()
        self.prompt.textEdited.connect(lambda _t: self.vlm.prompt_edited())
        state.options_changed.connect(lambda: self.vlm.redraw() if self.session.is_vlm else None)
        self.sink_plot = _plot(SINK_TITLE, "share", "new token")
        self.sink_plot.setToolTip("the share of attention on the first token, averaged over every layer and head")
        self.sink_plot.setYRange(0, 1)
        self.sink_curve = self.sink_plot.plot([], [], pen=pg.mkPen((200, 80, 40), width=2), symbol="o", symbolSize=5)
        self.sink_label = QLabel("")
        for label in (self.status, self.sink_label):  # long read-outs wrap instead of widening the page
            label.setWordWrap(True)
            label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)

        self.empty_hint = QLabel(EMPTY_HINT)
        self.empty_hint.setWordWrap(True)
        self.empty_hint.setAlignment(Qt.AlignCenter)
        self.empty_hint.setStyleSheet("QLabel { color: #555; padding: 24px; }")
        self.empty_hint.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Ignored)

        self._layout()
        self.session.started.connect(self._started)
        self.session.cleared.connect(self._cleared)
        self.session.prompt_ready.connect(self._prompt_ready)
        self.session.step_arrived.connect(self._step)
        self.session.finished.connect(self._finished)
        self.session.chat_known.connect(self._chat_known)
        state.model_loaded.connect(lambda _info: self._model_changed())
        state.busy_changed.connect(lambda _busy: self._sync_buttons())
        self._temperature_changed()
        self._model_changed()

    def _layout(self) -> None:
        """Two short rows of controls over the plots, so the page fits beside the side panel at 1024×700."""
        notice = QHBoxLayout()
        notice.addWidget(self.notice, 1)
        notice.addWidget(self.load_button)
        ask = QHBoxLayout()
        ask.addWidget(QLabel("Prompt"))
        ask.addWidget(self.prompt, 1)
        ask.addWidget(self.chat)
        ask.addWidget(self.generate_button)
        ask.addWidget(self.stop_button)
        knobs = QHBoxLayout()
        knobs.addWidget(QLabel("temperature"))
        knobs.addWidget(self.temperature)
        knobs.addWidget(self.temperature_label)
        knobs.addWidget(self.max_tokens)
        knobs.addStretch(1)
        pick = QHBoxLayout()
        pick.addWidget(self.mode)
        pick.addWidget(self.layer)
        pick.addWidget(self.head)
        pick.addWidget(self.vlm.average)
        pick.addStretch(1)
        right = QWidget()
        right_lay = QVBoxLayout(right)
        right_lay.setContentsMargins(0, 0, 0, 0)
        right_lay.addLayout(pick)
        right_lay.addWidget(self.attn_plot, 1)
        right_lay.addWidget(self.vlm, 1)
        left = QWidget()
        left_lay = QVBoxLayout(left)
        left_lay.setContentsMargins(0, 0, 0, 0)
        left_lay.addWidget(self.bars_plot, 3)
        left_lay.addWidget(self.sink_plot, 2)
        left_lay.addWidget(self.sink_label)
        plots = QSplitter(Qt.Horizontal)
        plots.addWidget(left)
        plots.addWidget(right)
        plots.setStretchFactor(0, 2)
        plots.setStretchFactor(1, 3)
        lay = _PageLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(notice)
        lay.addLayout(ask)
        lay.addLayout(knobs)
        lay.addWidget(self.output)
        lay.addWidget(self.status)
        self.plots_stack = QStackedWidget()  # a hint until the first step is drawn: no axes around nothing
        self.plots_stack.addWidget(self.empty_hint)
        self.plots_stack.addWidget(plots)
        lay.addWidget(self.plots_stack, 1)

    # ------------------------------------------------------------------ intent
    @property
    def temperature_value(self) -> float:
        return self.temperature.value() * 2.0 / TEMPERATURE_STEPS

    def generate(self) -> None:
        if not self.session.can_generate:
            return
        text = self.prompt.text()
        if not text.strip():
            self.state.error_raised.emit("the prompt is empty; type something for the model to continue")
            return
        self.session.start(text, chat=self.chat.isChecked(), temperature=self.temperature_value,
                           max_new_tokens=self.max_tokens.value())
        self._sync_buttons()

    def _temperature_changed(self) -> None:
        t = self.temperature_value
        self.temperature_label.setText("0 (greedy)" if t == 0 else f"{t:.2f}")
        self.temperature.setToolTip(f"temperature: {temperature_words(t)}")

    # ------------------------------------------------------------------ drawing
    def _model_changed(self) -> None:
        info = self.state.info
        ok = self.session.can_generate
        if info is None:
            self.notice.setText("No model is open yet.")
        elif not ok:
            self.notice.setText(f"{info.name} is an encoder: it reads the whole text at once and cannot write "
                                f"one token at a time. Generation needs a decoder such as {SUGGESTED_MODEL} or a "
                                "GPT-2 folder.")
        else:
            self.notice.setText(f"{info.name}: {info.num_layers} layers × {info.num_heads} heads, decoder."
                                + (f" {info.note}" if info.note else ""))
        self._vlm_mode(info, ok)
        self.load_button.setVisible(info is not None and not ok)
        if self.plots_stack.currentWidget() is self.empty_hint and not self.session.running:
            self.empty_hint.setText(self._hint())
        if info is not None and ok:
            self.layer.setRange(0, info.num_layers - 1)
            self.head.setRange(0, info.num_heads - 1)
            self.chat.setEnabled(True)
        self._sync_buttons()

    def _vlm_mode(self, info, ok: bool) -> None:
        """A vision-language model: the picture in the attention plot's place, greedy only, the prompt from the
        explorer's (it holds the image placeholder where the model's processor wants one)."""
        vlm = ok and self.session.is_vlm
        was = self.vlm.isVisible() or self.vlm.info is not None
        self.vlm.info = info if vlm else None
        self.vlm.setVisible(vlm)
        self.vlm.average.setVisible(vlm)
        self.mode.setVisible(not vlm)
        self.attn_plot.setVisible(not vlm)
        self.temperature.setEnabled(not vlm)
        self.temperature.setToolTip("greedy only for a vision-language model" if vlm else self.temperature.toolTip())
        if vlm:
            self.notice.setText(f"{info.name}: {info.num_layers} layers × {info.num_heads} heads, vision-language: "
                                "it writes after the window's picture and this prompt (greedy); each new word's "
                                "attention to the image tokens is drawn on the picture. " + weights_words(info))
            self.prompt.setText(self.state.text)
            self.layer.setEnabled(True)
            self.head.setEnabled(True)
        elif was:
            self.vlm.clear()

    def _chat_known(self, has: bool) -> None:
        """An instruct model (one with a chat template) gets chat ticked; without a template chat cannot run."""
        self.chat.setChecked(has)
        self.chat.setEnabled(has)
        self.chat.setToolTip("wrap the prompt in the model's chat template, as one user message" if has else
                             "this model has no chat template: the prompt goes in as it is")

    def _sync_buttons(self) -> None:
        ok = self.session.can_generate and not self.state.busy
        self.generate_button.setEnabled(ok)
        self.prompt.setEnabled(self.session.can_generate)
        self.stop_button.setEnabled(self.session.running)

    def _hint(self) -> str:
        if self.session.is_vlm and self.session.can_generate:
            return VLM_HINT
        return EMPTY_HINT if self.session.can_generate else "Generation needs a decoder: load one above."

    def _started(self) -> None:
        self._clear_views()
        self.vlm.clear("Generating: the first word is on its way.")
        self.empty_hint.setText("Generating: the first token is on its way.")

    def _cleared(self, note: str) -> None:
        self._clear_views()
        self.vlm.clear(note)
        self.status.setText(note)

    def _clear_views(self) -> None:
        """Everything drawn goes, titles included, and the plots give way to the hint."""
        self.output.setPlainText("")
        self.status.setText("")
        self.bars.setOpts(x0=[], y=[], width=[])
        self.bars_plot.getAxis("left").setTicks([[]])
        self.bars_plot.setTitle(BARS_TITLE, color="k", size="9pt")
        self.image.clear()
        self.attn_plot.setTitle("")
        self.empty_hint.setText(self._hint())
        self.plots_stack.setCurrentWidget(self.empty_hint)
        self.sink_curve.setData([], [])
        self.sink_label.setText("")
        self._sync_buttons()

    def _prompt_ready(self, prompt) -> None:
        self.status.setText(f"prompt: {len(prompt.ids)} tokens; generating…")
        if self.session.is_vlm and getattr(prompt, "image_token_positions", None) is not None:
            self.vlm.set_prompt(prompt)

    def _step(self, step) -> None:
        self.plots_stack.setCurrentIndex(1)
        cursor = self.output.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        cursor.insertText(step.text)
        k = min(BARS, len(step.top_probs))
        labels = [token_text(t, 16) for t in step.top_tokens[:k]]  # ␣ a leading space, ↵ a newline
        self.bars.setOpts(x0=np.zeros(k), y=np.arange(k), width=np.asarray(step.top_probs[:k]), height=0.7)
        self.bars_plot.getAxis("left").setTicks([list(enumerate(labels))])
        self.bars_plot.setXRange(0, max(1e-3, max(step.top_probs[:k], default=1.0)) * 1.05)
        self.bars_plot.setYRange(-0.5, k - 0.5)
        t = self.session.temperature  # the one this generation uses, not the slider's now
        self.bars_plot.setTitle(f"step {step.index + 1}: {temperature_words(t)}", color="k", size="9pt")
        sink = self.session.sink
        self.sink_curve.setData(np.arange(1, len(sink) + 1), np.asarray(sink))
        self.sink_label.setText(f"step {len(sink)}: {sink[-1]:.0%} of the attention is on the first token "
                                f"({self.session.prompt.tokens[0] if self.session.prompt else ''!r})")
        self.status.setText(f"step {step.index + 1}: {token_text(step.token)} (p = {step.top_probs[0]:.2f} for the top "
                            f"token), {step.ms:.0f} ms")
        if self.vlm.prompt is not None:
            self.vlm.add_step(step)
        self._draw_attention()

    def _draw_attention(self) -> None:
        if self.session.is_vlm:  # the picture instead of the rows: the layer and head choose what is drawn on it
            self.vlm.redraw()
            return
        by_head = self.mode.currentIndex() == 1
        self.layer.setEnabled(by_head)
        self.head.setEnabled(by_head)
        m = (self.session.head_rows(self.layer.value(), self.head.value()) if by_head
             else self.session.newest_rows())
        if m is None:
            self.image.clear()
            return
        # The first token's column (the sink) would take the whole colour range: scale to the rest, and
        # let that column saturate; its share has its own plot.
        top = float(np.nanmax(m[:, 1:])) if m.shape[1] > 1 else float(np.nanmax(m))
        self.image.setImage(np.nan_to_num(m, nan=0.0), levels=(0.0, max(top, 1e-6)))
        self.image.setRect(0, 0, m.shape[1], m.shape[0])
        vb = self.attn_plot.getViewBox()
        vb.setRange(xRange=(0, m.shape[1]), yRange=(0, m.shape[0]), padding=0)
        if by_head:
            self.attn_plot.setLabel("left", "new token (step)")
            self.attn_plot.setTitle(f"L{self.layer.value()} H{self.head.value()}: each step's row", color="k",
                                    size="9pt")
        else:
            self.attn_plot.setLabel("left", "layer × head")
            self.attn_plot.setTitle(f"newest row: {m.shape[0]} heads × {m.shape[1]} tokens", color="k", size="9pt")

    def _finished(self, how: str) -> None:
        n = len(self.session.steps)
        tokens = f"{n} token{'' if n == 1 else 's'}"
        if how.startswith("stopped"):
            self.status.setText(f"stopped after {tokens}{how[len('stopped'):]}")
        elif how == "done" and self.session.ended_at_once():
            end = token_text(self.session.steps[-1].token)
            why = (" For an instruct model tick Chat: it wraps the prompt in the model's chat template, the form "
                   "it was trained to answer." if not self.session.chat and self.session.has_chat else "")
            self.status.setText(f"The model ended at once: its first token was the end token {end}, so there is "
                                f"no answer.{why}")
        elif how == "done":
            self.status.setText(f"done: {tokens}" + (
                f"; last step {self.session.steps[-1].ms:.0f} ms" if self.session.steps else ""))
        else:
            self.status.setText(how)
        self._sync_buttons()
