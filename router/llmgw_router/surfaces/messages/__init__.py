"""Anthropic's Messages API (`POST /v1/messages`) on the chat path."""
