"""Regenerate ``support.jsonl``: a synthetic customer-support chat dataset in ShareGPT format.

Deterministic (seeded); about 800 conversations of one to four exchanges for a fictional SaaS
product, with a long tail (log excerpts, step-by-step guides) so that p95 and max differ the way
they do in real support data. Run from the repository root:

    python sdk/aegis/data/examples/_make_support.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PRODUCT = "Lumen"
PLANS = ["Starter", "Team", "Business", "Enterprise"]
SYSTEMS = [
    f"You are the support assistant for {PRODUCT}, a project-tracking app. Be concise, friendly and accurate.",
    f"You are {PRODUCT} Support. Answer with clear steps. If you need account details, ask for the workspace URL.",
    "You help customers with billing, login and integration questions. Never ask for passwords.",
]
NAMES = ["Priya", "Marco", "Aiko", "Sam", "Fatima", "Jonas", "Lucia", "Dev", "Chen", "Olu", "Hannah", "Mateo"]
INTEGRATIONS = ["Slack", "GitHub", "Google Drive", "Jira", "Zapier", "Microsoft Teams", "GitLab", "Figma"]
BROWSERS = ["Chrome 126", "Firefox 127", "Safari 17.5", "Edge 126"]


def _issue(rng: random.Random) -> tuple[str, str, list[tuple[str, str]]]:
    """(opening question, answer, follow-up exchanges) for one random topic."""
    name, plan, integ = rng.choice(NAMES), rng.choice(PLANS), rng.choice(INTEGRATIONS)
    seats = rng.choice([3, 5, 8, 12, 25, 40, 120])
    amount = rng.choice([48, 96, 180, 240, 600, 1200])
    topics = [
        (
            f"Hi, I forgot my password and the reset email never arrives. I checked spam too. My login is {name.lower()}@example.com",
            "Sorry about that! Reset emails come from no-reply@lumen.example and can take up to 10 minutes. "
            "If it still doesn't arrive: 1) make sure your company's mail filter allows that sender, "
            "2) try the reset once more from lumen.example/reset, and 3) if your workspace uses single sign-on, "
            "reset the password with your identity provider instead — Lumen doesn't store SSO passwords.",
            [("It's SSO, we use Okta.", "Then the password lives in Okta: use Okta's 'Forgot password' link or ask your "
              "Okta admin. Once you can sign in to Okta, choose 'Continue with SSO' on the Lumen login page.")],
        ),
        (
            f"We were charged ${amount} twice this month on the {plan} plan. Can you refund the duplicate?",
            f"I'm sorry for the double charge. I can see two payments of ${amount} on the same day; the second one "
            "was a retry after your bank returned a temporary error. I've refunded the duplicate — it takes 5 to 10 "
            "business days to appear on your statement. You'll get a refund receipt by email within the hour.",
            [("Will this happen again?", "It shouldn't: the retry happened because the first attempt timed out on "
              "the bank's side. If your card issuer flags it again, adding a billing email lets us warn you first.")],
        ),
        (
            f"How do I connect {integ} to my workspace?",
            f"Go to Settings → Integrations → {integ} and click Connect. You'll be redirected to {integ} to approve "
            f"access; pick the account or workspace you want to link and confirm. Back in {PRODUCT}, choose which "
            "projects should send updates. Only workspace admins can add integrations.",
            [(f"I don't see {integ} in the list.", "The list only shows integrations available on your plan. "
              f"{integ} is included from the Team plan up; on Starter you can use the webhook integration instead.")],
        ),
        (
            f"Can I add {seats} more seats without changing our billing date?",
            f"Yes. Adding seats is prorated: you'll pay for the {seats} new seats only for the days left in your "
            "current cycle, and your renewal date stays the same. Go to Billing → Seats, enter the new total and "
            "confirm. Invited users get access immediately.",
            [],
        ),
        (
            "Our exports to CSV are missing the custom fields. Is that a bug?",
            "Custom fields are exported, but only for projects where they're visible in the current view. In the "
            "export dialog, switch 'Columns' from 'Current view' to 'All fields' and export again. If a field is "
            "still missing, check that it isn't archived under Settings → Custom fields.",
            [("That worked, thanks!", "Glad to hear it! Let me know if anything else comes up.")],
        ),
        (
            "How do I delete my account and all our data?",
            "A workspace owner can delete the workspace under Settings → Workspace → Delete workspace. Deletion is "
            "permanent after a 14-day grace period, during which you can restore it by signing in. We remove backups "
            "within 30 days. If you only want to leave a workspace, use Profile → Leave workspace instead.",
            [("Can I get an export first?", "Yes — Settings → Export → Full workspace export creates a ZIP with "
              "every project, comment and attachment. Large workspaces can take up to an hour; we email the link.")],
        ),
        (
            f"The app is really slow on {rng.choice(BROWSERS)} since yesterday. Boards take 20 seconds to load.",
            "Thanks for reporting this. Could you try two things so we can narrow it down: open a private window and "
            "load the same board, and check whether disabling browser extensions changes anything? If it's still "
            "slow, please send us the board URL and the time you tried so we can look at the server logs.",
            [("Private window is fast.", "Then an extension is most likely interfering — ad blockers and some "
              "grammar checkers are common culprits. Re-enable them one by one to find which; you can allow-list "
              "lumen.example in that extension.")],
        ),
        (
            f"Do you offer a discount for nonprofits? We're a team of {seats}.",
            f"We do: registered nonprofits get 50% off the Team and Business plans. Apply at lumen.example/nonprofit "
            "with proof of status; approval usually takes two business days and the discount applies from your next "
            "invoice.",
            [],
        ),
        (
            "What's the API rate limit? We keep getting HTTP 429.",
            "The REST API allows 100 requests per minute per token, with bursts up to 20 requests per second. A 429 "
            "response includes a Retry-After header: wait that many seconds before retrying. For bulk jobs, use the "
            "batch endpoints (up to 100 items per call) or webhooks instead of polling.",
            [("Can the limit be raised?", "On Business and Enterprise plans, yes — contact us with your expected "
              "volume and use case and we can raise it per token.")],
        ),
    ]
    return rng.choice(topics)


def _long_debug(rng: random.Random) -> tuple[str, str]:
    """A long troubleshooting exchange with a log excerpt: the tail of the length distribution."""
    lines = []
    for i in range(rng.randint(6, 40)):
        lines.append(f"2024-06-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
                     f"{rng.randint(0, 59):02d}Z worker-{rng.randint(1, 9)} WARN webhook delivery failed "
                     f"id=wh_{rng.randrange(16**8):08x} status={rng.choice([502, 503, 504, 408])} attempt={i % 5 + 1}")
    question = ("Our webhook endpoint keeps failing and we're missing events. Here's what our logs show:\n\n"
                + "\n".join(lines) + "\n\nWhat are we doing wrong?")
    answer = ("Those status codes (502/503/504 and 408) come from your side of the connection: Lumen's deliveries "
              "are reaching a proxy or load balancer that can't reach your app in time. A few things to check:\n\n"
              "1. Respond within 10 seconds. Lumen waits 10 s for a 2xx; do the heavy work after replying "
              "(queue the event, then return 200).\n"
              "2. Check the proxy's upstream timeout and health checks — 502s usually mean the upstream was down "
              "or restarting at that moment.\n"
              "3. Make the handler idempotent. We retry up to 5 times with exponential backoff (1, 5, 25, 125, "
              "625 seconds), so the same event id can arrive more than once.\n"
              "4. Replay what you missed: Settings → Webhooks → Deliveries lists failed events from the last 7 days, "
              "and 'Redeliver' sends them again.\n\n"
              "If you send us the endpoint URL, we can check the delivery timings on our side.")
    return question, answer


def make_rows(n: int = 800, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = []
        if rng.random() < 0.35:
            turns.append({"from": "system", "value": rng.choice(SYSTEMS)})
        if rng.random() < 0.08:
            q, a = _long_debug(rng)
            follow: list[tuple[str, str]] = []
        else:
            q, a, follow = _issue(rng)
            if rng.random() < 0.3:
                q = f"Hello! {q}"
        turns += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        for fq, fa in follow:
            if rng.random() < 0.5:
                turns += [{"from": "human", "value": fq}, {"from": "gpt", "value": fa}]
        rows.append({"conversations": turns})
    return rows


def main() -> None:
    out = Path(__file__).with_name("support.jsonl")
    with out.open("w", encoding="utf-8") as fh:
        for row in make_rows():
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
