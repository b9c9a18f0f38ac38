"""Text as people read it: safe Markdown, plain terminal text, an API key found and redacted,
lone surrogates replaced."""
