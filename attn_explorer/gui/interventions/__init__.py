"""From picture to cause: switch heads off and patch them, the logit lens, contributions, relevance."""
