"""Structured output: output constraints (JSON schema, regex, Lark) enforced on every sampled position.

``constraint`` turns a request's ``response_format`` / ``guided_regex`` / ``guided_grammar`` into an
llguidance grammar; ``matcher`` keeps one matcher per request in the engine and computes the token
masks of the target's and the draft's rows, with rollback of rejected drafts.
"""

from xpuspec.structured.constraint import Constraint, constraint_of
from xpuspec.structured.matcher import GrammarCompiler, GuidedRequest

__all__ = ["Constraint", "GrammarCompiler", "GuidedRequest", "constraint_of"]
