"""Network definitions (plain nn.Modules giving logits); registered by jemeval.builtins.models."""
