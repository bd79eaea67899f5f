"""The request fingerprint and the digest of a stored outcome, as the use cases name them.

Both are pure functions of :mod:`service.evidence` (the rule is written there), because the
provider simulator recomputes the fingerprint from the payment it makes and the evidence it
signs carries both.
"""

from __future__ import annotations

from service.evidence import canonical_request, fingerprint, fingerprint_of, result_digest

__all__ = ["canonical_request", "fingerprint", "fingerprint_of", "result_digest"]
