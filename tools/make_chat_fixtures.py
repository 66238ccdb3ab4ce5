#!/usr/bin/env python3
"""Makes the chat-template, loss-mask and prompt/completion fixtures under tests/fixtures/chat/.

The reference is Hugging Face transformers' `apply_chat_template` and TRL's SFTTrainer data
preparation, run on small tokenizers with the real chat templates of four instruct models:

  llama3_1/  Llama 3.1 Instruct: tests/fixtures/bpe/llama3/tokenizer.json with the added special
             tokens renamed to Llama 3.1's layout (<|finetune_right_pad_id|>, <|eom_id|>,
             <|python_tag|> take the slots of three reserved tokens; ids, vocabulary and merges
             unchanged); tokenizer_config.json as meta-llama/Llama-3.1-8B-Instruct's
             (bos <|begin_of_text|>, eos <|eot_id|>, PreTrainedTokenizerFast);
             generation_config.json eos [<|end_of_text|>, <|eom_id|>, <|eot_id|>].
  qwen2/     Qwen2 Instruct: tests/fixtures/bpe/qwen2/tokenizer.json, copied; tokenizer_config.json
             as Qwen/Qwen2-7B-Instruct's (bos null, eos <|im_end|>, pad <|endoftext|>,
             Qwen2Tokenizer); generation_config.json eos [<|im_end|>, <|endoftext|>].
  mistral/   Mistral-7B-Instruct-v0.2: tokenizer.model (below), "legacy": true, as the model's
             tokenizer_config.json has it (transformers 5: Metaspace prepend_scheme "always").
  llama2/    Llama-2-7b-chat-hf: the same tokenizer.model, "legacy": false, as the model's
             tokenizer_config.json has it (transformers 5: prepend_scheme "first").
The tokenizer.model is a SentencePiece BPE model trained here in Llama's settings (unk 0 <unk>,
bos 1 <s>, eos 2 </s>, byte_fallback, identity normalization, add_dummy_prefix, no removal of
extra whitespace, split_digits, whitespace-only pieces) with a vocabulary of SP_VOCAB pieces, on
text that holds the fixture conversations and the [INST] / [/INST] / <<SYS>> markers
(deterministic: fixed text, one thread).

Files written (OUT = tests/fixtures/chat):
  OUT/<model>/                   tokenizer.json or tokenizer.model, tokenizer_config.json (with
                                 the real "chat_template" text), generation_config.json
  OUT/conversations.jsonl        {"name", "messages": [{"role", "content"}, ...]} per line
  OUT/<model>.expected.jsonl     one line per (conversation, add_generation_prompt in
                                 {false, true}): "text" = apply_chat_template(tokenize=False),
                                 "ids" = the same tokenized (input_ids), and without the
                                 generation prompt "assistant_masks" and "last_turn_masks" (one
                                 0/1 per id), "assistant_spans" (each assistant turn's trained
                                 span as [begin, end) UTF-8 byte offsets into "text") and, where
                                 a token crosses a span's edge, "straddling" (those token
                                 indices); or "error" = the template's exception text.
  OUT/completion.jsonl           {"name", "prompt", "completion"} and {"name", "instruction",
                                 "input", "output"} (Alpaca) records
  OUT/<model>.completion.jsonl   {"name", "prompt", "completion", "ids", "completion_mask"}:
                                 what TRL's SFTTrainer makes of each record with
                                 completion_only_loss=True (Alpaca records rendered first with the
                                 Stanford Alpaca prompt, as frugal's alpaca_prompt() writes it)

The trained span of assistant message k (frugal's rule, decided by the template's structure):
the text that rendering messages[:k+1] (add_generation_prompt=False) adds after rendering
messages[:k] with add_generation_prompt=True. The masks come from transformers'
apply_chat_template(return_assistant_tokens_mask=True) with a copy of each template that has
{% generation %} ... {% endgeneration %} around exactly that part of the assistant branch (MARKS
below); the script checks, for every conversation, that the marked copy renders the same text and
marks exactly the spans of the rule, and that TRL's SFTTrainer (assistant_only_loss=True) trains
the same positions. A token is trained when it overlaps a span (transformers' rule); the
last-turn mask applies the same rule to the last assistant span only.

Where the template texts come from (the strings are data; their sha256 is checked below):
  llama3_1  llama-cpp-python==0.3.16 sdist, vendor/llama.cpp/models/templates/
            meta-llama-Llama-3.1-8B-Instruct.jinja; byte-identical to trl==1.16.0
            trl/chat_templates/llama3_1.jinja and to xinference==4.1.0
            xinference/model/llm/models/llama-3.1-instruct.json "chat_template"
  qwen2     sglang==0.5.23 wheel, sglang/lang/chat_template.py line 136, a comment quoting the
            JSON string of Qwen/Qwen2-72B-Instruct's tokenizer_config.json (Qwen2 Instruct
            models share it), decoded as JSON
  mistral   guidance==0.3.1 wheel, guidance/chat.py `mistral_7b_instruct_template` (quoting
            mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json, 05/08/24); byte-identical
            to llama-cpp-python==0.3.36 (and 0.3.16) vendor/llama.cpp/tests/test-chat-template.cpp,
            case "mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a system
            prompt)"
  llama2    guidance==0.3.1 wheel, guidance/chat.py `llama2_template` (quoting
            meta-llama/Llama-2-7b-chat-hf tokenizer_config.json, 05/08/24)

Run (not in CI: CI has no Python peers), from the repository root:
  /work/venv/bin/python tools/make_chat_fixtures.py [--out tests/fixtures/chat]
Needs: transformers 5.x, trl 1.16, tokenizers, sentencepiece, torch (CPU), datasets, jinja2;
and tests/fixtures/bpe/{llama3,qwen2}/tokenizer.json (made by tools/make_bpe_fixtures.py).
Reruns reproduce the files byte for byte.
"""

import argparse
import hashlib
import io
import json
import logging
import os
import random
import shutil
import tempfile
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["llama3_1", "qwen2", "mistral", "llama2"]
SP_VOCAB = 1200

# --- the real chat templates, verbatim (see the docstring for their sources) -----------------

LLAMA3_1_TEMPLATE = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

QWEN2_TEMPLATE = r'''{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}'''

MISTRAL_TEMPLATE = r'''{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
'''

LLAMA2_TEMPLATE = r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
TEMPLATES = {"llama3_1": LLAMA3_1_TEMPLATE, "qwen2": QWEN2_TEMPLATE, "mistral": MISTRAL_TEMPLATE,
             "llama2": LLAMA2_TEMPLATE}
TEMPLATE_SHA256 = {
    "llama3_1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "qwen2": "793202280c0910ab26bc6eb57c8212c2417324c6d8c4efd0d10d59092ab3e3eb",
    "mistral": "796853172235ab3aaa4810013ddfe2eab481bda3306dad4f700c00d436eed596",
    "llama2": "e8d5b5a546d3f19df16a5320c614fab05bdc4edd50e850f1afd947b503ea41cf",
}

# --- the marked copies: (text replaced once, replacement) --------------------------------------
# Each puts {% generation %} around what the template emits for an assistant message after the
# generation prompt: Llama 3.1 the trimmed content and <|eot_id|> (the header is the generation
# prompt); Qwen2 the content, <|im_end|> and the "\n" after it; Mistral and Llama 2, whose
# add_generation_prompt adds nothing, everything the assistant branch writes (the leading space
# included).
MARKS = {
    "llama3_1": (
        r"""        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}""",
        r"""        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
        {%- if message['role'] == 'assistant' %}
            {%- generation %}
            {{- message['content'] | trim + '<|eot_id|>' }}
            {%- endgeneration %}
        {%- else %}
            {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}"""),
    "qwen2": (
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
        "{% if message['role'] == 'assistant' %}{{'<|im_start|>assistant\n'}}{% generation %}"
        "{{message['content'] + '<|im_end|>' + '\n'}}{% endgeneration %}{% else %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endif %}"),
    "mistral": (
        r"""        {{- ' ' + message['content'] + eos_token}}""",
        r"""        {%- generation %}
        {{- ' ' + message['content'] + eos_token}}
        {%- endgeneration %}"""),
    "llama2": (
        r"""{{ ' '  + content.strip() + ' ' + eos_token }}""",
        r"""{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}"""),
}


def marked_template(model):
    old, new = MARKS[model]
    text = TEMPLATES[model]
    assert text.count(old) == 1, f"{model}: the marked part must occur once in the template"
    return text.replace(old, new)


# --- the conversations ---------------------------------------------------------------------------


def msg(role, content):
    return {"role": role, "content": content}


def U(c):
    return msg("user", c)


def A(c):
    return msg("assistant", c)


def S(c):
    return msg("system", c)


CONVERSATIONS = [
    ("single_turn", [U("What is the capital of France?"), A("The capital of France is Paris.")]),
    ("single_turn_system", [S("You are a concise geography tutor."), U("Name the largest ocean."),
                            A("The Pacific Ocean.")]),
    ("multi_turn", [
        U("Can you help me with some arithmetic?"), A("Of course. What would you like to compute?"),
        U("What is 12345 + 678?"), A("12345 + 678 = 13023."),
        U("And 3.14 * 2?"), A("3.14 * 2 = 6.28.")]),
    ("multi_turn_system", [
        S("You are a helpful coding assistant.\nAnswer briefly."),
        U("How do I reverse a list in Python?"),
        A("Use slicing:\n\n```python\nitems = [1, 2, 3]\nitems[::-1]\n```"),
        U("And in place?"), A("Call `items.reverse()`;\tit returns None."),
        U("Thanks!"), A("You're welcome.")]),
    # Leading and trailing spaces, tabs and newlines: Llama 3.1 trims them, Llama 2 strips them,
    # Qwen2 and Mistral keep them.
    ("whitespace", [
        U("  Tell me a joke.  "),
        A("  \n Why did the tokenizer cross the road?\n\nTo get to the other side.\n  "),
        U("\tAnother one?\n"), A("\n\nNo more jokes today. ")]),
    # CJK, emoji (with a ZWJ sequence), a combining accent written decomposed (Qwen2's NFC
    # composes it; the others keep it).
    ("unicode", [
        U("Translate \"good morning\" into Japanese, please. Is cafe\u0301 the same as caf\u00e9?"),
        A("\u304a\u306f\u3088\u3046\u3054\u3056\u3044\u307e\u3059 \u2600\ufe0f\U0001f44b \u2014 "
          "\u4f60\u597d\uff0c\u4e16\u754c\uff01\uc548\ub155\ud558\uc138\uc694. "
          "Yes: e\u0301 is e plus U+0301, \u00e9 is one code point. "
          "\U0001f468\u200d\U0001f469\u200d\U0001f467")]),
    # Special tokens' strings written in the content: transformers encodes each as the special
    # token wherever the tokenizer has it.
    ("special_token_literal", [
        U("What do <|im_end|>, </s>, <|eot_id|> and [INST] mean?"),
        A("Control markers: <|im_end|> ends a ChatML turn, </s> ends a sequence.")]),
    ("ends_with_user", [U("Hi!"), A("Hello! How can I help?"), U("Tell me about the moon.")]),
    ("system_then_user", [S("You are a pirate. Speak like one."), U("Where is the treasure?")]),
    ("user_only", [U("Write a haiku about autumn.")]),
    # Refused by Llama 2 and Mistral (roles must alternate), rendered by the others.
    ("not_alternating", [U("First question."), U("Second question right after."),
                         A("Answering both.")]),
    ("assistant_first", [A("Welcome! Ask me anything."), U("What is 2 + 2?"), A("4.")]),
    # A system message after the first message: Mistral raises; Llama 2 drops it silently (it
    # sits where an assistant message would); Llama 3.1 and Qwen2 render it as a turn.
    ("system_mid", [U("Hello."), S("From now on, answer in French."), U("How are you?"),
                    A("Je vais bien, merci.")]),
]

# --- prompt/completion and Alpaca records --------------------------------------------------------

PROMPT_COMPLETION = [
    ("pc_space_in_completion", "The capital of France is", " Paris."),
    ("pc_newline", "Q: What is 2 + 2?\nA:", " 4"),
    # The prompt ends with a space that the completion's first word absorbs in tokenization:
    # TRL starts the completion where the two tokenizations diverge.
    ("pc_trailing_space_prompt", "Translate to French: ", "Bonjour"),
    ("pc_unicode", "Say hello in Japanese:", " \u3053\u3093\u306b\u3061\u306f \U0001f44b"),
    ("pc_multiline", "List two colors:", "\n- red\n- blue"),
]
ALPACA = [
    ("alpaca_no_input", "Give three tips for staying healthy.", "",
     "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Get enough sleep."),
    ("alpaca_with_input", "Summarize the text in one sentence.",
     "Byte-level BPE merges frequent pairs of bytes into tokens until the vocabulary is full.",
     "It builds tokens by merging frequent byte pairs."),
    ("alpaca_unicode", "Translate to Chinese.", "Good morning", "\u65e9\u4e0a\u597d"),
]


def alpaca_prompt(instruction, input_text):
    """The Stanford Alpaca prompt, as src/data/corpus.cpp alpaca_prompt() writes it."""
    if not input_text:
        return ("Below is an instruction that describes a task. Write a response that "
                "appropriately completes the request.\n\n### Instruction:\n" + instruction +
                "\n\n### Response:\n")
    return ("Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n" + instruction + "\n\n### Input:\n" + input_text +
            "\n\n### Response:\n")


def completion_records():
    records = [{"name": n, "prompt": p, "completion": c} for n, p, c in PROMPT_COMPLETION]
    records += [{"name": n, "instruction": i, "input": x, "output": o} for n, i, x, o in ALPACA]
    return records


def as_prompt_completion(record):
    if "prompt" in record:
        return record["prompt"], record["completion"]
    return alpaca_prompt(record["instruction"], record["input"]), record["output"]


# --- the SentencePiece model ---------------------------------------------------------------------

FILLER_WORDS = (
    "the of and to in is was for it with as on be at by had are but from or have an they which "
    "one you were all she there would their we him been has when who will more if out so said "
    "what up about into them can only other time new some could these two may first then do any "
    "like my now over such our man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too "
    "little good very make world still own see work long get here between both life being under "
    "never day same another know while last might great old year off come since against go came "
    "right used take three question answer assistant user system model token tokenizer template "
    "chat message turn loss mask train python list reverse slicing items code function return "
    "value number compute arithmetic capital france paris ocean pacific joke road side moon "
    "treasure pirate haiku autumn translate japanese french english hello morning please thanks "
    "welcome help tell write name largest instruction response input task request").split()
MARKERS = ["[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]


def sp_training_lines():
    """The SentencePiece training text: the fixtures' own strings (so their words become pieces,
    as in a real vocabulary), the Llama 2 / Mistral prompt markers in the places the templates
    write them, and filler sentences. Characters seen only a few times (some CJK, the emoji)
    stay out of the vocabulary and go through byte fallback."""
    rng = random.Random(49)

    def sentence():
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randrange(10 ** rng.randint(1, 6))))
        s = " ".join(words)
        return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!", ",", ":"])

    own = []
    for _, messages in CONVERSATIONS:
        for m in messages:
            own += [line for line in m["content"].split("\n") if line.strip()]
    for record in completion_records():
        for text in as_prompt_completion(record):
            own += [line for line in text.split("\n") if line.strip()]
    lines = own * 3
    for _ in range(400):
        lines.append(f"[INST] {sentence()} [/INST] {sentence()}")
        lines.append(f"[INST] <<SYS>> {sentence()} <</SYS>> {sentence()} [/INST]")
    lines += [sentence() for _ in range(6000)]
    return lines


def train_sentencepiece():
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sp_training_lines()), model_writer=model, model_type="bpe",
        vocab_size=SP_VOCAB, character_coverage=0.99995, byte_fallback=True, split_digits=True,
        allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, max_sentencepiece_length=16,
        split_by_unicode_script=True, split_by_number=True, split_by_whitespace=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_piece="<unk>", bos_piece="<s>",
        eos_piece="</s>", num_threads=1, minloglevel=2)
    return model.getvalue()


# --- the tokenizer directories -------------------------------------------------------------------

def llama3_1_special_tokens():
    """Llama 3.1's 256 special tokens, in id order (Llama 3's with three reserved slots named)."""
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
             "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    names += [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
    assert len(names) == 256
    return names


def dump_json(path, value, compact=False):
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(value, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(value, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")


def added_token(content):
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}


def write_model_dirs(out, sp_model):
    bpe = os.path.join(REPO, "tests", "fixtures", "bpe")
    dirs = {m: os.path.join(out, m) for m in MODELS}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)

    # Llama 3.1 Instruct
    with open(os.path.join(bpe, "llama3", "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    names = llama3_1_special_tokens()
    assert len(j["added_tokens"]) == len(names)
    for token, name in zip(j["added_tokens"], names):
        assert token["special"] and (token["content"] == name or "reserved" in token["content"])
        token["content"] = name
    dump_json(os.path.join(dirs["llama3_1"], "tokenizer.json"), j, compact=True)
    ids = {t["content"]: t["id"] for t in j["added_tokens"]}
    dump_json(os.path.join(dirs["llama3_1"], "tokenizer_config.json"), {
        "bos_token": "<|begin_of_text|>", "chat_template": TEMPLATES["llama3_1"],
        "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"})
    dump_json(os.path.join(dirs["llama3_1"], "generation_config.json"), {
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]})

    # Qwen2 Instruct
    shutil.copyfile(os.path.join(bpe, "qwen2", "tokenizer.json"),
                    os.path.join(dirs["qwen2"], "tokenizer.json"))
    with open(os.path.join(bpe, "qwen2", "tokenizer.json"), encoding="utf-8") as f:
        added = json.load(f)["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    dump_json(os.path.join(dirs["qwen2"], "tokenizer_config.json"), {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in
                                                ("content", "lstrip", "normalized", "rstrip",
                                                 "single_word", "special")} for t in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "chat_template": TEMPLATES["qwen2"], "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 32768,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    dump_json(os.path.join(dirs["qwen2"], "generation_config.json"), {
        "bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]})

    # Mistral-7B-Instruct-v0.2 and Llama-2-7b-chat-hf: one SentencePiece model, two configs
    for m in ("mistral", "llama2"):
        with open(os.path.join(dirs[m], "tokenizer.model"), "wb") as f:
            f.write(sp_model)
    dump_json(os.path.join(dirs["mistral"], "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {"0": added_token("<unk>"), "1": added_token("<s>"),
                                 "2": added_token("</s>")},
        "additional_special_tokens": [], "bos_token": "<s>",
        "chat_template": TEMPLATES["mistral"], "clean_up_tokenization_spaces": False,
        "eos_token": "</s>", "legacy": True,
        "model_max_length": 1000000000000000019884624838656, "pad_token": None,
        "sp_model_kwargs": {}, "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
        "use_default_system_prompt": False})
    dump_json(os.path.join(dirs["mistral"], "generation_config.json"),
              {"bos_token_id": 1, "eos_token_id": 2})

    def legacy_added_token(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False}
    dump_json(os.path.join(dirs["llama2"], "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": legacy_added_token("<s>"),
        "chat_template": TEMPLATES["llama2"], "clean_up_tokenization_spaces": False,
        "eos_token": legacy_added_token("</s>"), "legacy": False,
        "model_max_length": 1000000000000000019884624838656, "pad_token": None,
        "padding_side": "right", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer",
        "unk_token": legacy_added_token("<unk>")})
    dump_json(os.path.join(dirs["llama2"], "generation_config.json"),
              {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    return dirs


# --- rendering, spans and masks ------------------------------------------------------------------

def load_tokenizer(directory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(directory)


def render(tok, messages, add_generation_prompt, chat_template=None):
    return tok.apply_chat_template(messages, tokenize=False, chat_template=chat_template,
                                   add_generation_prompt=add_generation_prompt)


def rule_spans(tok, messages, full):
    """The trained span of each assistant message by frugal's rule, as [begin, end) indices
    into `full`; None when an assistant message has nothing before it (the rule needs the
    rendering of the messages before it)."""
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if k == 0:
            return None
        before = render(tok, messages[:k], True)
        through = render(tok, messages[:k + 1], False)
        if not through.startswith(before) or not full.startswith(through):
            raise SystemExit(f"prefix rule fails: {messages!r} at message {k}:\n"
                             f"{before!r}\n{through!r}\n{full!r}")
        spans.append((len(before), len(through)))
    return spans


def marked_spans(tok, model, messages):
    """The text the marked template renders and the spans its {% generation %} blocks mark."""
    from transformers.utils.chat_template_utils import render_jinja_template
    texts, indices = render_jinja_template(
        conversations=[messages], chat_template=marked_template(model),
        return_assistant_tokens_mask=True, add_generation_prompt=False, **tok.special_tokens_map)
    return texts[0], [tuple(s) for s in indices[0]]


def overlap_mask(offsets, spans):
    """1 for each token whose character offsets overlap a span (transformers' rule)."""
    return [int(any(e > b and s < end for b, end in spans)) for s, e in offsets]


def straddling(offsets, spans):
    return [i for i, (s, e) in enumerate(offsets)
            if any(s < edge < e for b, end in spans for edge in (b, end))]


def byte_offset(text, index):
    return len(text[:index].encode("utf-8"))


def chat_cases(model, tok):
    """The expected lines of one model, and the conversations that TRL should see."""
    lines, for_trl = [], []
    marked = marked_template(model)
    for name, messages in CONVERSATIONS:
        for agp in (False, True):
            line = {"name": name, "add_generation_prompt": agp}
            try:
                text = render(tok, messages, agp)
            except Exception as e:  # the template's raise_exception
                line["error"] = str(e)
                lines.append(line)
                continue
            enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          add_generation_prompt=agp)
            ids = list(enc["input_ids"])
            line["text"], line["ids"] = text, ids
            if not agp:
                spans = rule_spans(tok, messages, text)
                marked_text, generation = marked_spans(tok, model, messages)
                if marked_text != text:
                    raise SystemExit(f"{model}/{name}: the marked template renders other text")
                if spans is None:
                    line["masks_left_out"] = ("an assistant message with nothing before it has "
                                              "no span by the rule")
                else:
                    if generation != spans:
                        raise SystemExit(f"{model}/{name}: marked spans {generation} != rule "
                                         f"spans {spans}")
                    out = tok.apply_chat_template(messages, chat_template=marked, tokenize=True,
                                                  return_dict=True,
                                                  return_assistant_tokens_mask=True)
                    assert list(out["input_ids"]) == ids, (model, name)
                    masks = list(out["assistant_masks"])
                    offsets = out.encodings[0].offsets
                    assert overlap_mask(offsets, spans) == masks, (model, name)
                    line["assistant_masks"] = masks
                    line["last_turn_masks"] = overlap_mask(offsets, spans[-1:])
                    line["assistant_spans"] = [[byte_offset(text, b), byte_offset(text, e)]
                                               for b, e in spans]
                    cross = straddling(offsets, spans)
                    if cross:
                        line["straddling"] = cross
                    if spans:
                        for_trl.append((name, messages, masks))
            lines.append(line)
    return lines, for_trl


# --- TRL's SFTTrainer data preparation -----------------------------------------------------------

def tiny_model(vocab_size):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=16,
                                        intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2,
                                        max_position_embeddings=4096))


def trl_prepared(tok, rows, **config):
    """The train dataset SFTTrainer builds from `rows` (its own tokenize and label steps)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to="none", use_cpu=True, max_length=None,
                         bf16=False, fp16=False, **config)
        trainer = SFTTrainer(model=tiny_model(len(tok)), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tok)
        return [dict(r) for r in trainer.train_dataset]


def trl_assistant_masks(directory, model, for_trl):
    tok = load_tokenizer(directory)
    tok.chat_template = marked_template(model)
    prepared = trl_prepared(tok, [{"messages": m} for _, m, _ in for_trl],
                            assistant_only_loss=True)
    assert len(prepared) == len(for_trl)
    differ = []
    for (name, _, masks), row in zip(for_trl, prepared):
        trained = [int(label != -100) for label in row["labels"]]
        if trained != masks:
            differ.append(name)
    return differ


def trl_completions(directory):
    tok = load_tokenizer(directory)
    records = completion_records()
    rows = []
    for record in records:
        prompt, completion = as_prompt_completion(record)
        rows.append({"prompt": prompt, "completion": completion})
    prepared = trl_prepared(tok, rows, completion_only_loss=True)
    lines = []
    for record, row, prepared_row in zip(records, rows, prepared):
        lines.append({"name": record["name"], "prompt": row["prompt"],
                      "completion": row["completion"], "ids": list(prepared_row["input_ids"]),
                      "completion_mask": [int(label != -100) for label in prepared_row["labels"]]})
    return lines, tok.eos_token


# --- checks of the tokenizers against their own libraries ---------------------------------------

def check_tokenizer(model, directory, tok, texts):
    """Checks transformers' tokenization against the file's own library and returns how many
    texts were compared and how many differ. tokenizer.json: tokenizers must give the same ids.
    tokenizer.model (plain text, Mistral's "always" scheme): SentencePiece gives the same ids,
    except that transformers' Metaspace adds no "▁" to a text that already starts with a space
    (it takes that space as the prefix) where SentencePiece adds its dummy prefix anyway; so a
    text starting with a space must encode as SentencePiece encodes the text without it."""
    if model in ("llama3_1", "qwen2"):
        from tokenizers import Tokenizer
        raw = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        for text in texts:
            ours = tok(text, add_special_tokens=False)["input_ids"]
            if raw.encode(text, add_special_tokens=False).ids != list(ours):
                raise SystemExit(f"{model}: transformers and tokenizers differ on {text!r}")
        return len(texts), 0
    if model == "mistral":
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(directory, "tokenizer.model"))
        plain = [t for t in texts if not any(s in t for s in ("<s>", "</s>", "<unk>"))]
        differ = 0
        for text in plain:
            ours = list(tok(text, add_special_tokens=False)["input_ids"])
            differ += sp.encode(text) != ours
            if sp.encode(text[1:] if text.startswith(" ") else text) != ours:
                raise SystemExit(f"{model}: transformers and SentencePiece differ on {text!r}")
        return len(plain), differ
    return None, None  # llama2: the same tokenizer.model as mistral


def write_jsonl(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "chat"))
    args = ap.parse_args()
    for model, text in TEMPLATES.items():
        assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA256[model], model
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import datasets
    datasets.disable_progress_bars()

    os.makedirs(args.out, exist_ok=True)
    sp_model = train_sentencepiece()
    assert sp_model == train_sentencepiece(), "SentencePiece training is not deterministic"
    dirs = write_model_dirs(args.out, sp_model)
    write_jsonl(os.path.join(args.out, "conversations.jsonl"),
                [{"name": n, "messages": m} for n, m in CONVERSATIONS])
    write_jsonl(os.path.join(args.out, "completion.jsonl"), completion_records())
    check_texts = [m["content"] for _, ms in CONVERSATIONS for m in ms]
    check_texts += [t for r in completion_records() for t in as_prompt_completion(r)]
    check_texts += sp_training_lines()[-2000:]

    for model in MODELS:
        tok = load_tokenizer(dirs[model])
        lines, for_trl = chat_cases(model, tok)
        rendered = [line["text"] for line in lines if "text" in line]
        checked, sp_differ = check_tokenizer(model, dirs[model], tok, rendered + check_texts)
        write_jsonl(os.path.join(args.out, f"{model}.expected.jsonl"), lines)
        differ = trl_assistant_masks(dirs[model], model, for_trl)
        if differ:
            raise SystemExit(f"{model}: TRL's assistant_only_loss labels differ from "
                             f"transformers' masks on {differ}")
        completions, eos = trl_completions(dirs[model])
        write_jsonl(os.path.join(args.out, f"{model}.completion.jsonl"), completions)
        errors = sum("error" in line for line in lines)
        cross = [line["name"] for line in lines if "straddling" in line]
        check = ("the tokenizer.model checked with mistral" if checked is None else
                 f"{checked} texts checked against the tokenizer's own library ({sp_differ} "
                 f"differ by the leading-space rule)")
        print(f"{model}: {type(tok).__name__}, {len(lines)} lines ({errors} template errors), "
              f"TRL masks equal on {len(for_trl)} conversations, {check}, tokens straddling "
              f"a span edge in {cross or 'none'}; completions end with {eos!r}")


if __name__ == "__main__":
    main()
