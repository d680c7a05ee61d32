"""The agent runtime: `local_agent` tasks that call a model with tools until it answers.

Built on pydantic-ai (the loop, the providers, usage counts, message-history JSON and the
offline `FunctionModel`); shoal adds models by spec string (`models`), the deterministic
scripted and replay models (`scripted`, `replay`), the sidechain transcript (`transcript`) and
the tools the model sees (`tools`).
"""
