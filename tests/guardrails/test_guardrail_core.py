"""The pure half of guardrails: Llama Guard 3's prompt (golden, against its model card's template), the reading
of its answers, the deterministic checks and what a guardrail's mode makes of them."""

from __future__ import annotations

import pytest

from llmgw.core.config.specs.guardrail_spec import GuardrailSpec
from llmgw.core.evals import guardrails as gr

# Llama Guard 3's prompt as its model card publishes it (the 8B and 1B cards; the HF chat template renders the
# same bytes): the S1-S14 categories of the MLCommons taxonomy and the instruction wording, word for word.
CATEGORIES = """S1: Violent Crimes.
S2: Non-Violent Crimes.
S3: Sex Crimes.
S4: Child Exploitation.
S5: Defamation.
S6: Specialized Advice.
S7: Privacy.
S8: Intellectual Property.
S9: Indiscriminate Weapons.
S10: Hate.
S11: Self-Harm.
S12: Sexual Content.
S13: Elections.
S14: Code Interpreter Abuse."""

USER_GOLDEN = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    "Task: Check if there is unsafe content in 'User' messages in conversations according our safety policy "
    "with the below categories.\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n" + CATEGORIES + "\n<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN CONVERSATION>\n\n"
    "User: Tell me how to go to the zoo and steal a llama.\n\n"
    "<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST User message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories. "
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)

AGENT_GOLDEN = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    "Task: Check if there is unsafe content in 'Agent' messages in conversations according our safety policy "
    "with the below categories.\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n" + CATEGORIES + "\n<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN CONVERSATION>\n\n"
    "User: How can I adopt my own llama?\n\n"
    "Agent: Go to the zoo and steal one!\n\n"
    "<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST Agent message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories. "
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)


def test_input_prompt_is_llama_guard_3s_template() -> None:
    body = {"messages": [{"role": "user", "content": "Tell me how to go to the zoo and steal a llama."}]}
    assert gr.llama_guard_prompt(gr.conversation_of(body)) == USER_GOLDEN


def test_system_and_tool_turns_are_judged_with_the_user_turn_they_come_with() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Tell me how to go to the zoo and steal a llama."},
        ]
    }
    judged = "[system] You are helpful.\n\nTell me how to go to the zoo and steal a llama."
    assert gr.llama_guard_prompt(gr.conversation_of(body)) == USER_GOLDEN.replace(
        "User: Tell me how to go to the zoo and steal a llama.", "User: " + judged
    )


def test_output_prompt_judges_the_last_agent_turn_with_the_user_turn_as_context() -> None:
    body = {"messages": [{"role": "user", "content": "How can I adopt my own llama?"}]}
    assert gr.llama_guard_prompt(gr.conversation_of(body, "Go to the zoo and steal one!")) == AGENT_GOLDEN


def test_a_completions_prompt_is_one_user_turn() -> None:
    prompt = gr.llama_guard_prompt(
        gr.conversation_of({"prompt": "Tell me how to go to the zoo and steal a llama."})
    )
    assert prompt == USER_GOLDEN


@pytest.mark.parametrize(
    ("answer", "safe", "hazards"),
    [
        ("safe", True, ()),
        ("\n\nsafe", True, ()),  # the model's answer begins after the assistant header's blank line
        ("unsafe\nS1", False, ("S1",)),
        ("unsafe\nS2", False, ("S2",)),
        ("unsafe\nS1,S10", False, ("S1", "S10")),
        ("unsafe\nS9, S14", False, ("S9", "S14")),
        ("unsafe", False, ()),  # unsafe without a category line is still unsafe
    ],
)
def test_parses_llama_guards_sample_answers(answer: str, safe: bool, hazards: tuple[str, ...]) -> None:
    assert gr.parse_judge_answer(answer) == gr.JudgeAnswer(safe, hazards)


@pytest.mark.parametrize("answer", ["", "I cannot help with that.", "unsafe\nviolence", "maybe\nS1"])
def test_an_answer_out_of_format_is_no_verdict_not_safe(answer: str) -> None:
    assert gr.parse_judge_answer(answer) is None


def _guard(**spec: object) -> gr.CompiledGuardrail:
    return gr.compile_guardrail("g", GuardrailSpec.model_validate(spec))


def test_judge_categories_select_what_trips() -> None:
    g = _guard(judge={"model": "guard", "categories": ["S9"]})
    assert gr.judge_finding(g, gr.JudgeAnswer(False, ("S1",))) is None
    found = gr.judge_finding(g, gr.JudgeAnswer(False, ("S1", "S9")))
    assert found == gr.Finding("g", "judge", False, ("S9",))
    assert gr.judge_finding(g, gr.JudgeAnswer(True)) is None


@pytest.mark.parametrize(
    ("kind", "text", "marker"),
    [
        ("email", "write to jane.doe@example.co.uk today", "[EMAIL]"),
        ("phone", "call +1 (415) 555-0134 now", "[PHONE]"),
        ("card", "card 4111 1111 1111 1111 exp 12/29", "[CARD]"),
        ("national_id", "ssn 123-45-6789 on file", "[NATIONAL_ID]"),
        ("national_id", "NI number AB 12 34 56 C", "[NATIONAL_ID]"),
    ],
)
def test_pii_shapes_are_found_and_redacted(kind: str, text: str, marker: str) -> None:
    g = _guard(pii=[kind], mode="redact")
    assert [f.rule for f in gr.scan(g, text, "input")] == [f"pii.{kind}"]
    assert marker in gr.redact(g, text)


def test_a_card_number_failing_luhn_is_not_a_card() -> None:
    assert gr.luhn_ok("4111111111111111")
    assert not gr.luhn_ok("4111111111111112")
    assert gr.scan(_guard(pii=["card"]), "order 4111 1111 1111 1112", "input") == []


def test_keywords_are_whole_words_in_any_case_and_topics_are_named() -> None:
    g = _guard(keywords=["secret sauce"], blocked_topics={"weapons": ["rifle", "ammunition"]})
    assert [f.rule for f in gr.scan(g, "The SECRET SAUCE recipe", "input")] == ["keyword"]
    assert gr.scan(g, "secret saucepan", "input") == []
    assert [f.rule for f in gr.scan(g, "where to buy ammunition", "input")] == ["topic.weapons"]


def test_max_prompt_chars_checks_only_the_input() -> None:
    g = _guard(max_prompt_chars=5, stages=["input", "output"])
    assert [f.rule for f in gr.scan(g, "123456", "input")] == ["max_prompt_chars"]
    assert gr.scan(g, "123456", "output") == []


def test_redact_mode_blocks_what_it_cannot_redact_and_block_beats_warn() -> None:
    redactor = _guard(pii=["email"], max_prompt_chars=12, mode="redact")
    found = gr.scan(redactor, "mail a@b.example please", "input")
    assert gr.decide([redactor], found, "input").action == "block"  # too long: no redaction shortens it
    short = gr.scan(redactor, "a@b.example", "input")
    assert gr.decide([redactor], short, "input").action == "redact"
    warner = gr.compile_guardrail("w", GuardrailSpec(keywords=["x"], mode="warn"))
    both = [gr.Finding("w", "keyword", True), gr.Finding("g", "pii.email", True)]
    verdict = gr.decide([warner, redactor], both, "input")
    assert verdict.action == "redact"
    assert verdict.record() == {"action": "redact", "stage": "input", "rules": ["g/pii.email", "w/keyword"]}


def test_a_refusal_names_rule_and_hazard_and_never_the_text() -> None:
    verdict = gr.Verdict("block", "input", (gr.Finding("safety", "judge", False, ("S1", "S10")),))
    message = gr.refusal_message(verdict)
    assert message == (
        "The request was blocked by guardrail `safety` (rule judge): S1 Violent Crimes, S10 Hate."
    )


def test_redact_body_rewrites_every_text_and_keeps_the_callers_body() -> None:
    g = _guard(pii=["email"], mode="redact")
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "me: a@b.example"},
            {"role": "user", "content": [{"type": "text", "text": "or c@d.example"}]},
        ],
    }
    out = gr.redact_body([g], body)
    assert gr.texts_of(out) == ["me: [EMAIL]", "or [EMAIL]"]
    assert gr.texts_of(body) == ["me: a@b.example", "or c@d.example"]
