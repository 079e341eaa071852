"""The Gradio chat app in a real browser: headless Debian Chromium driven by Playwright."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aegis
import pytest
from aegis.planning.report.format import format_bytes
from aegis_agent import AgentSettings, ChatAgent, RunManager
from aegis_apps.gradio_app import command_buttons, loss_frame, memory_frame

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"]


_OVERFLOW_JS = """h => {
  // the plan's message bubble: the nearest ancestor of the heading that Gradio styles as a message
  let bubble = h;
  while (bubble.parentElement && !/message|bubble/.test(bubble.className || '')) bubble = bubble.parentElement;
  const wide = [];
  let checked = 0;
  for (const el of [bubble, ...bubble.querySelectorAll('*')]) {
    if (!el.clientWidth) continue;
    checked += 1;
    if (el.scrollWidth > el.clientWidth + 1) wide.push(`${el.tagName}.${el.className}: ${el.scrollWidth} > ${el.clientWidth}`);
  }
  return {bubble: `${bubble.tagName}.${bubble.className}`, checked, wide: wide.slice(0, 10)};
}"""
"""Elements of the plan message wider than their box (scrollWidth > clientWidth): none may overflow its bubble."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_memory_frame_stacks_to_the_capacity() -> None:
    """One bar: the components sum to the report's total; with margin and headroom it reaches the budget."""
    from aegis.planning.report._facts import plan_facts

    report = aegis.plan("qlora llama-3.1-8b on 3090")
    frame = memory_frame(report)
    mem, f = report.recommended.memory, plan_facts(report).memory
    assert frame["bar"].nunique() == 1 and "RTX 3090" in frame["bar"][0]
    assert list(frame["component"]) == [c.key for c in mem.components if c.in_peak] + ["overhead", "margin", "headroom"]
    parts = frame[~frame["component"].isin(["margin", "headroom"])]
    assert parts["GiB"].sum() == pytest.approx(mem.total_bytes / 2**30, abs=0.01)
    assert frame["GiB"].sum() == pytest.approx(f.budget_bytes / 2**30, abs=0.01)
    assert memory_frame(None).empty
    over = memory_frame(aegis.plan("full llama-3.1-70b on 3090"))  # the smallest tried, over capacity: no headroom
    assert "headroom" not in set(over["component"])


def test_memory_chart_names_every_band_with_headroom_last() -> None:
    """The chart's bands are the breakdown's components in the report's order (each with its label and bytes), then
    overhead, margin and the free headroom; they reach the budget; every band is in the HTML legend."""
    from aegis.planning.report._facts import plan_facts
    from aegis_apps.gradio_app import memory_bands, memory_chart_html

    for text in ("qlora llama-3.1-8b on 3090", "lora qwen2.5-7b on 2x a100 40gb", "full llama-3.2-1b on a100 80gb"):
        report = aegis.plan(text)
        facts = plan_facts(report)
        mem = facts.tier.memory
        bands = memory_bands(report)
        parts = [(c.key, c.name, c.bytes) for c in mem.components if c.in_peak]
        assert [tuple(b) for b in bands[: len(parts)]] == parts
        assert [b.key for b in bands[len(parts):]] == ["overhead", "margin"] + (
            ["headroom"] if facts.memory.headroom_bytes > 0 else [])
        assert sum(b.bytes for b in bands) == (
            facts.memory.budget_bytes if facts.memory.headroom_bytes > 0 else facts.memory.high_bytes)
        html = memory_chart_html(report)
        for b in bands:
            assert f'<li data-key="{b.key}">' in html and format_bytes(b.bytes) in html
    assert memory_chart_html(None) == "" and memory_bands(None) == []


def test_loss_frame_and_buttons() -> None:
    from aegis.supervise.status import RunStatusReport

    frame = loss_frame((3.0, float("nan"), 2.0), (10, 11, 14))  # the steps the metrics logged, gaps and all
    assert list(frame["step"]) == [10, 14] and list(frame["loss"]) == [3.0, 2.0]
    st = RunStatusReport(run_id="r1", run_dir="runs/r1", status="paused", live=False, step=12, total_steps=20,
                         pending_reason="loss spike", suggested_actions=("set_lr 0.0003", "resume", "stop"),
                         suspected_samples=("toxic-0001",))
    assert command_buttons(st) == ["set_lr 0.0003", "blacklist_samples toxic-0001", "resume", "stop"]
    assert command_buttons(st.model_copy(update={"status": "running", "pending_reason": None})) == []


_SQUEEZED_JS = """chat => {
  // every table cell in the chat must hold its text on one line: a squeezed column wraps it (one character per line)
  const cells = [...chat.querySelectorAll('table th, table td')].filter(c => c.textContent.trim());
  const squeezed = [];
  for (const c of cells) {
    const r = document.createRange();
    r.selectNodeContents(c);
    const lines = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
    if (lines.size > 1) squeezed.push(`${c.textContent.trim()}: ${lines.size} lines, ${Math.round(c.clientWidth)} px`);
  }
  return {cells: cells.length, squeezed: squeezed.slice(0, 10)};
}"""
"""Table cells of the chat whose text wraps onto several lines."""

_CHART_JS = """chart => {
  const bands = [...chart.querySelectorAll('.aegis-band')].map(b => {
    const r = b.getBoundingClientRect();
    return {key: b.dataset.key, left: r.left, right: r.right, width: r.width};
  });
  const legend = [...chart.querySelectorAll('.aegis-mem-legend li')].map(li => ({
    key: li.dataset.key, text: li.innerText, visible: li.getBoundingClientRect().width > 0,
    clipped: li.scrollWidth > li.clientWidth + 1,
  }));
  const box = chart.querySelector('.aegis-mem').getBoundingClientRect();
  return {bands, legend, right: box.right};
}"""


def _overlap(a: dict | None, b: dict | None) -> bool:
    return bool(a and b and a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
                and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


@pytest.mark.slow
@pytest.mark.browser
def test_browser_plan_shows_total_chart_and_recommended_config(tmp_path: Path) -> None:
    """At 820 and 1366 px: the plan, its total and chart; the GPU table readable (no cell wrapped); every band of the
    memory chart named in the legend with its size, headroom last; nothing drawn over the chat's first line."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: `apt-get install -y chromium` (CI installs it)")
    from aegis_apps.gradio_app import build_ui, launch, memory_bands
    from playwright.sync_api import sync_playwright

    settings = AgentSettings(runs_dir=str(tmp_path / "runs"))
    agent = ChatAgent(settings, runs=RunManager(settings, compile_cache=False))
    demo = build_ui(agent)
    port = _free_port()
    launch(demo, port=port, block=False)
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False" and not demo.analytics_enabled
    assert demo.server_name == "127.0.0.1" and demo.share_url is None
    report = aegis.plan("qlora llama-3.1-8b on 3090")
    total = format_bytes(report.recommended.memory.total_bytes)
    cfg = report.recommended.config
    bands = memory_bands(report)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
            for width in (820, 1366):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
                box = page.locator("#aegis-input textarea")
                box.wait_for(timeout=30_000)
                box.fill("qlora llama-3.1-8b on 3090")
                box.press("Enter")
                chat = page.locator("#aegis-chat")
                chat.get_by_role("heading", name="Recommended Config").wait_for(timeout=60_000)
                page.locator("#aegis-memory-total").get_by_text(f"Memory total: {total}").wait_for(timeout=30_000)
                chart = page.locator("#aegis-memory-chart")
                chart.locator(".aegis-band").first.wait_for(timeout=30_000)
                chat_text = chat.inner_text()
                assert f"{total} predicted" in chat_text
                assert f"micro batch {cfg.micro_batch_size} x grad accum {cfg.gradient_accumulation_steps}" in chat_text
                assert "RTX 3090" in chat_text
                assert "Fallbacks" in chat_text and "fall\nbac" not in chat_text
                heading = chat.get_by_role("heading", name="Aegis plan:")
                overflow = heading.evaluate(_OVERFLOW_JS)
                assert overflow["checked"] > 20 and not overflow["wide"], overflow
                # nothing (a label, an avatar) drawn over the reply's first line
                heading.evaluate("e => e.scrollIntoView()")
                first = heading.bounding_box()
                for other in chat.locator("[data-testid='block-label'], .avatar-container").all():
                    if other.is_visible():
                        assert not _overlap(other.bounding_box(), first), (width, other.bounding_box(), first)
                # the chart: one band per component, overhead, margin and headroom, each named in the legend
                drawn = chart.evaluate(_CHART_JS)
                assert [b["key"] for b in drawn["bands"]] == [b.key for b in bands]
                assert [li["key"] for li in drawn["legend"]] == [b.key for b in bands]
                for band, li in zip(bands, drawn["legend"]):
                    assert li["visible"] and not li["clipped"] and band.label in li["text"], (width, li)
                    assert format_bytes(band.bytes) in li["text"]
                assert drawn["bands"][-1]["key"] == "headroom"  # free memory last, at the right end
                assert drawn["bands"][-1]["left"] >= max(b["right"] for b in drawn["bands"][:-1]) - 1
                # the GPU comparison: a wide table, readable at this width (scrolls sideways, never wraps a cell)
                box.fill("which gpus fit?")
                box.press("Enter")
                chat.get_by_text("Which GPUs fit (cheapest first)").wait_for(timeout=120_000)
                chat.locator("table td").first.wait_for(timeout=30_000)
                table = chat.evaluate(_SQUEEZED_JS)
                assert table["cells"] > 50 and not table["squeezed"], (width, table)
                page.wait_for_timeout(500)
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"gradio-chat-{width}.png"), full_page=True)
                page.close()
            browser.close()
    finally:
        demo.close()
        agent.close()
    for width in (820, 1366):
        assert (ARTIFACTS / f"gradio-chat-{width}.png").stat().st_size > 10_000


@pytest.mark.browser
@pytest.mark.slow
def test_browser_run_panel_buttons_steer_a_paused_run(
    tmp_path: Path, fast_template: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: `apt-get install -y chromium` (CI installs it)")
    from aegis_apps.gradio_app import build_ui, launch
    from playwright.sync_api import expect, sync_playwright

    settings = AgentSettings(runs_dir=str(tmp_path / "runs"), run_template=str(fast_template), run_tiers="template")
    runs = RunManager(settings, compile_cache=False)
    agent = ChatAgent(settings, runs=runs)
    demo = build_ui(agent, refresh_s=0.5)
    port = _free_port()
    launch(demo, port=port, block=False)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
            box = page.locator("#aegis-input textarea")
            chat = page.locator("#aegis-chat")
            for text, answer in [
                ("qlora llama-3.1-8b on 3090", "Fits."),
                ("start the run", "Started run"),
                ("interrupt", "Sent interrupt"),
            ]:
                box.fill(text)
                box.press("Enter")
                chat.get_by_text(answer).first.wait_for(timeout=60_000)
            run_id = runs.latest_run_id()
            status = page.locator("#aegis-run-status")
            expect(status).to_contain_text("Waiting for you", timeout=240_000)
            expect(page.locator("#aegis-run-details")).to_contain_text("interrupt requested by an operator")
            lower = page.get_by_role("button", name="set_lr")
            lower.wait_for(timeout=10_000)
            new_lr = float(lower.inner_text().split()[1])
            lower.click()
            chat.get_by_text(f"Sent set_lr {new_lr:g}").wait_for(timeout=30_000)
            runs.wait(run_id, lambda s: s.lr == new_lr, timeout_s=60)
            page.get_by_role("button", name="resume", exact=True).click()
            expect(status).to_contain_text("completed", timeout=240_000)
            expect(page.get_by_role("button", name="resume", exact=True)).to_be_hidden()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "gradio-run.png"), full_page=True)
            browser.close()
        final = runs.status(run_id)
        assert final.status == "completed" and final.lr == new_lr and final.step == final.total_steps
    finally:
        runs.shutdown()
        demo.close()
        agent.close()
