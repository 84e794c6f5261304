"""The console on a phone: a page opened at a phone's width must not be wider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PHONE = {"width": 375, "height": 812}


async def phone_context(browser: Any) -> Any:
    """A browser context of a phone's viewport (close it when done)."""
    return await browser.new_context(viewport=PHONE, device_scale_factor=2)


async def fits_a_phone(page: Any, url: str, name: str, shots: Path) -> None:
    """Open `url` on a phone's page, fail if it is wider than the phone, and keep a
    screenshot as `<name>-375.png`."""
    await page.goto(url)
    await page.wait_for_load_state("networkidle")
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{name} is {width} px wide on a phone"
    await page.screenshot(path=shots / f"{name}-375.png", full_page=True)
