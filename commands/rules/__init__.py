"""The rules the plane decides by and the auditor checks against, in one room below both:
what is signed and by whom (``signing``), which keys and signatures the plane trusts
(``trust``: people's keys, policy, decisions, tokens, reviews), the digest a token binds
a run's results by, the one deviation of a truncated output, and the plans' outcome
vocabulary (``vocabulary``). The auditor imports these, never the plane it audits.
"""
