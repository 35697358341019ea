"""The OpenAI HTTP front, shared by ``motor-gateway`` and the coordinator's co-located front.

``app.Gateway`` (routes, validation, SSE relay, request ids, client disconnects) relays every
request through a :class:`~motor_common.openai_front.dispatch.DispatchClient`: ``motor-gateway``
passes its gRPC client over the coordinator pool (``motor_gateway.client``), ``motor-coordinator``
an in-process one (``motor_coordinator.http_front``). Its parts: ``openai`` (validation, error
objects), ``limits`` and ``admission`` (bounds on what clients send), ``site`` (the listening
socket), ``access_log`` and ``metrics``.
"""
