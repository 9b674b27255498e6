"""Synthetic filler for eval worlds: names, ids, amounts and plausible business prose from a seeded rng.

Tool outputs in the suites are long on purpose (the key facts are buried in them); this module
makes the surrounding text varied enough that a model cannot skip it by pattern, and
deterministic given the rng.
"""

from __future__ import annotations

import random

FIRST = ("Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
         "Kofi", "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Samir", "Tove",
         "Umar", "Vera", "Wen", "Ximena", "Yusuf", "Zofia")
LAST = ("Almeida", "Becker", "Castillo", "Dubois", "Eriksen", "Fontaine", "Garcia", "Haddad",
        "Ivanova", "Jensen", "Kowalski", "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov",
        "Quispe", "Rossi", "Silva", "Takahashi", "Umarov", "Varga", "Weber", "Yilmaz", "Zhang")
CITIES = ("Lisbon", "Oslo", "Porto", "Lyon", "Krakow", "Ghent", "Tartu", "Bilbao", "Turku", "Graz",
          "Aarhus", "Brno", "Cork", "Delft", "Espoo", "Basel", "Split", "Malmo", "Riga", "Pisa")
SUBJECTS = ("The customer", "Our team", "The account manager", "Support", "The auditor",
            "Finance", "The vendor", "Operations", "The on-call engineer", "Legal")
VERBS = ("reviewed", "confirmed", "updated", "questioned", "escalated", "archived", "noted",
         "re-checked", "approved", "postponed", "documented", "forwarded")
OBJECTS = ("the shipping schedule", "the quarterly statement", "a billing discrepancy",
           "the contract renewal", "the delivery address", "a duplicate payment",
           "the service level terms", "the tax certificate", "a refund request",
           "the onboarding checklist", "the migration plan", "a warranty claim",
           "the access review", "the backup rotation", "an invoice correction")
TAILS = ("after a call on Tuesday", "pending a second signature", "with no further action needed",
         "as requested in the previous ticket", "following the regional guidelines",
         "before the end of the month", "in line with the standard procedure",
         "and attached the supporting documents", "without changing the account status",
         "and scheduled a follow-up", "per the usual checklist", "for the internal record")


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def code(rng: random.Random, prefix: str, digits: int = 5) -> str:
    """An id such as CUST-04821 (digits, zero padded)."""
    return f"{prefix}-{rng.randrange(10 ** digits):0{digits}d}"


def alnum(rng: random.Random, n: int) -> str:
    """n characters from an unambiguous alphabet (no 0/O, 1/I)."""
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(n))


def amount(rng: random.Random, lo: float = 20.0, hi: float = 2500.0) -> float:
    return round(rng.uniform(lo, hi), 2)


def date(rng: random.Random, year: int = 2026) -> str:
    return f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def unique_codes(rng: random.Random, prefix: str, n: int, digits: int = 5) -> list:
    """n distinct ids with the same prefix."""
    seen: set = set()
    out = []
    while len(out) < n:
        c = code(rng, prefix, digits)
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def unique_codes_alnum(rng: random.Random, prefix: str, n: int, length: int = 5) -> list:
    """n distinct ids such as RF-7H2K9 (order of generation, so deterministic)."""
    seen: set = set()
    out = []
    while len(out) < n:
        c = f"{prefix}-{alnum(rng, length)}"
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out
