"""Aegis front ends over the SDK and the conversational agent: a Gradio chat app and a Slack bot.

Thin by design: they render with the SDK's renderers (`aegis.planning.report`) and route messages to
`aegis_agent.ChatAgent` and its `RunManager`; no planning logic lives here. Importing this package
imports neither gradio nor slack-bolt.

    aegis chat                 # Gradio on http://127.0.0.1:7860 (apps/aegis_apps/gradio_app.py)
    aegis slack                # Socket Mode with SLACK_APP_TOKEN, or --http (apps/aegis_apps/slack.py)
"""

__all__: list[str] = []
