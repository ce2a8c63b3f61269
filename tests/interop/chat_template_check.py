"""Checks ztrain's chat templates and supervised data reader against transformers' apply_chat_template.

Usage: chat_template_check.py SFT_TOOL [WORK_DIR]
  (SFT_TOOL: build/tests/worker/sft_tool; ZT_SOURCE_DIR names the source tree, default two folders up;
  WORK_DIR keeps the files written, default a temporary folder)

For each chat template ztrain knows, the real template string its models publish (written below, as in
their tokenizer_config.json) and a small tokenizer built with the tokenizers library in the style of that
family (byte-level BPE for ChatML / Qwen and LLaMA-3, SentencePiece-style BPE with byte fallback for LLaMA-2,
Mistral, Gemma and Phi-3), with the special tokens the template writes added:
  - ztrain recognises the template from the file (tokenizer_config.json) as that family;
  - for a suite of conversations (with and without a system prompt, one and several turns, Unicode, emoji,
    whitespace at the edges of messages, text that looks like markup), ztrain's token ids equal
    transformers' apply_chat_template(tokenize=True) with the template string, with and without
    add_generation_prompt; a conversation the template raises on (roles that do not alternate, a system
    role where the family has none) is refused by ztrain too;
  - the tokens ztrain trains on are exactly the assistant turns: the tokens whose text (the library's offsets)
    ends inside an assistant turn as the template writes it, located in transformers' rendering (content,
    trimmed where the template trims, and the end-of-turn marker);
  - the same conversations read from a JSONL file by ztrain's supervised data reader give the same ids and
    flags, line by line;
  - prompt/completion records (read without a template) give the library's ids of prompt + completion with
    its special tokens, then eos, and train exactly the tokens whose text ends in the completion, and eos.
Then an unknown template is refused with a message naming the templates ztrain knows.

Exit status: 0 when everything matches, 1 otherwise, 77 when transformers, jinja2 or tokenizers is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2  # noqa: F401  (apply_chat_template needs it)
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    import transformers
    from transformers import PreTrainedTokenizerFast
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/install-deps.sh installs transformers, jinja2 and "
          "tokenizers in .venv)")
    sys.exit(77)

SRC = os.environ.get("ZT_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CORPUS = os.path.join(SRC, "data", "corpus.txt")

# ---- the templates, as the models publish them (tokenizer_config.json's chat_template) ----

# teknium/OpenHermes-2.5-Mistral-7B (plain ChatML)
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Qwen/Qwen2-7B-Instruct
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system"
         "\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
         "assistant\\n' }}{% endif %}")

# Qwen/Qwen2.5-7B-Instruct
QWEN25 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

# meta-llama/Llama-2-7b-chat-hf
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
          "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")

# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
          "+ message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if "
          "loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
          "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

# meta-llama/Llama-3.1-8B-Instruct
LLAMA31 = r'''{{- bos_token }}
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

# mistralai/Mistral-7B-Instruct-v0.3
MISTRAL = r'''{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
'''

# google/gemma-7b-it (and Gemma 2)
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
         "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
         "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")

# google/gemma-3-1b-it
GEMMA3 = r'''{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
'''

# microsoft/Phi-3-mini-4k-instruct
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
        "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}"
        "{% endif %}")

# microsoft/Phi-3.5-mini-instruct
PHI35 = PHI3.replace("{% if message['role'] == 'system' %}", "{% if message['role'] == 'system' and message['content'] %}")

# name -> (template, tokenizer style, bos, eos, special tokens, the family ztrain must recognise, span rule)
CASES = {
    "chatml": (CHATML, "qwen", None, "<|im_end|>", [], "chatml", "chatml"),
    "qwen2": (QWEN2, "qwen", None, "<|im_end|>", [], "chatml", "chatml"),
    "qwen2.5": (QWEN25, "qwen", None, "<|im_end|>", [], "chatml", "chatml"),
    "llama2": (LLAMA2, "spm-legacy", "<s>", "</s>", [], "llama2", "llama2"),
    "llama3": (LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", [], "llama3", "llama3"),
    "llama3.1": (LLAMA31, "llama3", "<|begin_of_text|>", "<|eot_id|>", [], "llama3.1", "llama3"),
    "mistral": (MISTRAL, "spm", "<s>", "</s>", ["[INST]", "[/INST]"], "mistral", "mistral"),
    "gemma": (GEMMA, "spm-gemma", "<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"], "gemma", "gemma"),
    "gemma3": (GEMMA3, "spm-gemma", "<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"], "gemma3", "gemma"),
    "phi3": (PHI3, "spm-legacy", "<s>", "<|endoftext|>",
             ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"], "phi3", "phi3"),
    "phi3.5": (PHI35, "spm-legacy", "<s>", "<|endoftext|>",
               ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"], "phi3", "phi3"),
}

# What comes before an assistant turn, and the turn as the template writes it (the trained text).
HEAD = {"chatml": "<|im_start|>assistant\n", "llama2": " [/INST]", "llama3": "assistant<|end_header_id|>\n\n",
        "mistral": "[/INST]", "gemma": "<start_of_turn>model\n", "phi3": "<|assistant|>\n"}


def turn_text(rule, content, eos):
    if rule == "chatml":
        return content + "<|im_end|>"
    if rule == "llama2":
        return " " + content.strip() + " " + eos
    if rule == "llama3":
        return content.strip() + "<|eot_id|>"
    if rule == "mistral":
        return " " + content.strip() + eos
    if rule == "gemma":
        return content.strip() + "<end_of_turn>"
    return content + "<|end|>"


def u(t):
    return {"role": "user", "content": t}


def a(t):
    return {"role": "assistant", "content": t}


def s(t):
    return {"role": "system", "content": t}


CONVERSATIONS = [
    [u("What is 2+3?"), a("2+3 = 5.")],
    [s("You are a terse assistant."), u("Reverse the word 'stressed'."), a("desserts")],
    [u("Übersetze „Guten Morgen“ ins Japanische."), a("おはようございます。"), u("And in Arabic? 🙂"),
     a("صباح الخير 👋🏽"), u("Thanks!"), a("You're welcome.")],
    [s("  Answer in one line.  "), u("  padded question \n"), a("  answer with spaces  \n\n"), u("tabs\there\t"),
     a("line one\nline two")],
    [u("Is <b>bold</b> [x] {y} markup?"), a("Yes: <b> is HTML, [x] is a link label.")],
    [s("Système: réponds en français."), u("Combien font 7 × 6 ?"), a("7 × 6 = 42."), u("Et 12 ÷ 4 ?"), a("3.")],
    [u("Count: 1 2 3"), a("4 5 6"), u("again"), a("7  8   9")],
    [s(""), u("Say nothing."), a(""), u("   "), a("  \t ")],
    # breaks the rules of some templates
    [u("first"), u("second"), a("answer")],
    [s("system only before an assistant"), a("no user turn")],
]


def generation_suite():
    out = []
    for c in CONVERSATIONS:
        users = [i for i, m in enumerate(c) if m["role"] == "user"]
        if users:
            out.append(c[:users[-1] + 1])
    return out


# ---- tokenizers ----

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_RE = QWEN2_RE.replace(r"\p{N}|", r"\p{N}{1,3}|", 1)


def training_texts():
    with open(CORPUS, encoding="utf-8") as f:
        corpus = f.read()
    texts = [corpus]
    for c in CONVERSATIONS[:4]:
        texts += [m["content"] for m in c]
    return texts


def byte_level(pattern, specials):
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(training_texts(), trainers.BpeTrainer(
        vocab_size=1500, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t


def sentencepiece(style, specials):
    """BPE pieces trained with a Metaspace pre-tokenizer, laid out as LLaMA-2's tokenizer.json (<unk> <s> </s>,
    the 256 byte tokens, the pieces; byte fallback). spm-legacy: normalizer Prepend + Replace and no
    pre-tokenizer (LLaMA-2, Phi-3); spm: a Metaspace pre-tokenizer (prepend_scheme first, no split), as newer
    conversions write Mistral; spm-gemma: Replace only (Gemma adds no prefix space), <pad> <eos> <bos> <unk>."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    t.train_from_iterator(training_texts(), trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                                                max_token_length=16))
    trained = json.loads(t.to_str())["model"]
    base = ["<pad>", "<eos>", "<bos>", "<unk>"] if style == "spm-gemma" else ["<unk>", "<s>", "</s>"]
    vocab = {c: i for i, c in enumerate(base)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in enumerate(base)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": trained["merges"]},
    }
    if style == "spm":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    elif style == "spm-gemma":
        spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        spec["decoder"]["decoders"] = spec["decoder"]["decoders"][:3]
    t = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    if specials:
        t.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in specials])
    return t


def with_bos(t, bos):
    """A post-processor that puts bos before a text, as the models' tokenizer.json files have it (the chat
    template writes its own bos: apply_chat_template adds no special tokens, and neither does ztrain)."""
    t.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, t.token_to_id(bos))])
    return t


def build_tokenizer(style, specials):
    if style == "qwen":
        return byte_level(QWEN2_RE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + specials)
    if style == "llama3":
        return with_bos(byte_level(CL100K_RE, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                               "<|end_header_id|>", "<|eot_id|>"] + specials), "<|begin_of_text|>")
    return with_bos(sentencepiece(style, specials), "<bos>" if style == "spm-gemma" else "<s>")


# ---- running ztrain ----

def run_tool(tool, *args):
    p = subprocess.run([tool] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def parse_ids(line):
    ids, flags = line.split("|")
    return [int(x) for x in ids.split()], [int(x) for x in flags.split()]


class Report:
    def __init__(self):
        self.failures = 0
        self.checks = 0

    def check(self, ok, what):
        self.checks += 1
        if not ok:
            self.failures += 1
            print(f"FAIL {what}")


def expected_flags(lib, text, conv, rule, eos, ids):
    """The flags of the tokens of text whose last character lies inside an assistant turn."""
    enc = lib.encode(text, add_special_tokens=False)
    assert enc.ids == ids, "the library's ids of the rendered text differ from apply_chat_template's"
    spans, pos = [], 0
    for m in conv:
        if m["role"] != "assistant":
            continue
        want = HEAD[rule] + turn_text(rule, m["content"], eos)
        i = text.find(want, pos)
        if i < 0:
            return None
        spans.append((i + len(HEAD[rule]), i + len(want)))
        pos = i + len(want)
    return [int(any(b < end <= e for b, e in spans)) for (_, end) in enc.offsets]


def render_hf(hf, conv, gen):
    """(text, ids) from apply_chat_template, or None when the template raises."""
    try:
        text = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
        out = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen)
    except Exception as e:  # the template's raise_exception, or a Jinja error
        return None, str(e)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return text, list(out)


def check_case(rep, tool, name, case, work):
    template, style, bos, eos, specials, family, rule = case
    lib = build_tokenizer(style, specials)
    tok_path = os.path.join(work, f"{name}.tokenizer.json")
    lib.save(tok_path)
    cfg = {"chat_template": template, "eos_token": eos}
    if bos:
        cfg["bos_token"] = bos
    cfg_path = os.path.join(work, f"{name}.tokenizer_config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    rc, out, err = run_tool(tool, "detect", cfg_path)
    rep.check(rc == 0 and out.strip() == family, f"{name}: recognised as '{out.strip()}' ({err.strip()}), "
              f"expected {family}")

    hf = PreTrainedTokenizerFast(tokenizer_file=tok_path, bos_token=bos, eos_token=eos)
    hf.chat_template = template
    for gen, suite in ((False, CONVERSATIONS), (True, generation_suite())):
        in_path = os.path.join(work, f"{name}.{int(gen)}.jsonl")
        with open(in_path, "w", encoding="utf-8") as f:
            for c in suite:
                f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
        out_path = in_path + ".out"
        rc, _, err = run_tool(tool, "chat", tok_path, cfg_path, in_path, out_path, *(["--gen"] if gen else []))
        if rc != 0:
            rep.check(False, f"{name}: sft_tool chat failed: {err.strip()}")
            continue
        with open(out_path, encoding="utf-8") as f:
            lines = f.read().split("\n")[1:]
        train_lines = []
        for k, conv in enumerate(suite):
            what = f"{name} conversation {k + 1}{' (generation prompt)' if gen else ''}"
            text, ids = render_hf(hf, conv, gen)
            got = lines[k]
            if text is None:
                rep.check(got.startswith("error:"), f"{what}: transformers raises ({ids}); ztrain gave {got[:80]}")
                continue
            if got.startswith("error:"):
                rep.check(False, f"{what}: ztrain refuses it ({got}), transformers renders {text!r}")
                continue
            zids, zflags = parse_ids(got)
            if zids != ids:
                k0 = next((i for i, (x, y) in enumerate(zip(zids, ids)) if x != y), min(len(zids), len(ids)))
                rep.check(False, f"{what}: ids differ from apply_chat_template's at {k0}: ztrain "
                          f"{lib.decode(zids[k0:k0 + 8], skip_special_tokens=False)!r}, transformers "
                          f"{lib.decode(ids[k0:k0 + 8], skip_special_tokens=False)!r}; text {text!r}")
                continue
            rep.check(True, what)
            if gen:
                continue
            want = expected_flags(lib, text, conv, rule, eos, ids)
            if want is None:
                rep.check(False, f"{what}: an assistant turn is not where the template should write it: {text!r}")
                continue
            rep.check(zflags == want, f"{what}: trained tokens differ: ztrain "
                      f"{[lib.id_to_token(i) for i, f in zip(ids, zflags) if f]} expected "
                      f"{[lib.id_to_token(i) for i, f in zip(ids, want) if f]}")
            if any(m["role"] == "assistant" for m in conv):
                train_lines.append((conv, ids, want))
        if gen:
            continue
        # the same chats through the supervised data reader
        data_path = os.path.join(work, f"{name}.train.jsonl")
        with open(data_path, "w", encoding="utf-8") as f:
            for conv, _, _ in train_lines:
                f.write(json.dumps({"messages": conv}, ensure_ascii=False) + "\n")
        rc, _, err = run_tool(tool, "open", tok_path, cfg_path, data_path, data_path + ".out")
        if rc != 0:
            rep.check(False, f"{name}: the reader refused the chats: {err.strip()}")
            continue
        with open(data_path + ".out", encoding="utf-8") as f:
            got = [ln for ln in f.read().split("\n") if ln]
        rep.check(len(got) == len(train_lines), f"{name}: the reader kept {len(got)} of {len(train_lines)} chats")
        for (conv, ids, want), ln in zip(train_lines, got):
            zids, zflags = parse_ids(ln.split(":", 1)[1])
            rep.check(zids == ids and zflags == want, f"{name}: the reader's example {ln.split(':')[0]} differs")


PAIRS = [("Q: What is 2+3?\nA:", " 5"), ("Reverse 'abc': ", "cba"), ("Übersetze: ", "おはよう 🙂"),
         ("prompt ending in spaces   ", "  answer"), ("no space", "joined"), ("", "all completion")]


def check_prompt_completion(rep, tool, name, work):
    """prompt/completion records read without a template: the library's ids of prompt + completion with its
    special tokens (bos), then eos; trained: the tokens whose text ends in the completion, and eos."""
    tok_path = os.path.join(work, f"{name}.tokenizer.json")
    lib = Tokenizer.from_file(tok_path)
    eos = CASES[name][3]
    data_path = os.path.join(work, f"{name}.pc.jsonl")
    with open(data_path, "w", encoding="utf-8") as f:
        for p, c in PAIRS:
            f.write(json.dumps({"prompt": p, "completion": c}, ensure_ascii=False) + "\n")
    rc, _, err = run_tool(tool, "open", tok_path, "-", data_path, data_path + ".out", "--eos", eos)
    if rc != 0:
        rep.check(False, f"{name} prompt/completion: refused: {err.strip()}")
        return
    with open(data_path + ".out", encoding="utf-8") as f:
        got = [ln for ln in f.read().split("\n") if ln]
    rep.check(len(got) == len(PAIRS), f"{name} prompt/completion: {len(got)} examples of {len(PAIRS)}")
    for (p, c), ln in zip(PAIRS, got):
        enc = lib.encode(p + c, add_special_tokens=True)
        ids = enc.ids + [lib.token_to_id(eos)]
        want = [int(e > len(p) and not sp) for (_, e), sp in zip(enc.offsets, enc.special_tokens_mask)] + [1]
        zids, zflags = parse_ids(ln.split(":", 1)[1])
        rep.check(zids == ids, f"{name} prompt/completion {p!r}: ids {zids} expected {ids}")
        rep.check(zflags == want, f"{name} prompt/completion {p!r}: flags {zflags} expected {want}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="zt-chat-")
    os.makedirs(work, exist_ok=True)
    print(f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}; files in {work}")
    rep = Report()
    for name, case in CASES.items():
        before = rep.failures
        check_case(rep, tool, name, case, work)
        if name in ("llama2", "llama3", "mistral"):
            check_prompt_completion(rep, tool, name, work)
        print(f"{name}: {'ok' if rep.failures == before else 'FAILED'}")
    # an unknown template: Vicuna's, which ztrain does not render
    cfg_path = os.path.join(work, "unknown.tokenizer_config.json")
    with open(cfg_path, "w") as f:
        json.dump({"chat_template": "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'USER: ' + m['content'] "
                                    "+ ' ' }}{% else %}{{ 'ASSISTANT: ' + m['content'] + '</s>' }}{% endif %}"
                                    "{% endfor %}"}, f)
    rc, out, err = run_tool(tool, "detect", cfg_path)
    rep.check(rc == 1 and "chatml" in err and "gemma" in err and "--chat-template" in err,
              f"an unknown template is refused naming the known ones (rc {rc}: {err.strip()})")
    print(f"{rep.checks - rep.failures} passed, {rep.failures} failed")
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
