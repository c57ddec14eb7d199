"""A tool-using agent written in plain OpenAI client code, as agents are (docs/agents.md): it offers the
model a calculator, runs the calls the model makes, and ends at the first answer without one. ppo-lm
trains it as it is written, its calls the episode's turns and its return the reward:

    ppo-lm train --rollout.agent examples/agents/calculator.py:run --iterations 2 --output-dir runs/agent

Each prompt row is one of the run's prompts (`data.prompts`; the built-in task's rows hold `prompt`,
"Solve x+1=9", and `answer`, "8").
"""

import json
import re

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression of integers, + - * / and brackets.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[\d\s+\-*/()]+", expression):
        return "error: only integers, + - * / and brackets"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (digits and operators only)
    except (SyntaxError, ZeroDivisionError) as e:
        return f"error: {e}"


def run(client, row) -> float:
    messages = [{"role": "user", "content": f"{row['prompt'].strip()}. Give x as a number."}]
    for _ in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            result = calculate(str(args.get("expression", ""))) if call.function.name == "calculate" else "error: no such tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    numbers = re.findall(r"-?\d+", messages[-1].get("content") or "")
    return float(bool(numbers) and numbers[-1] == str(row["answer"]))
