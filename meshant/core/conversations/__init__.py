"""Conversations: questions and answers, the update logs attachable from a cursor, the
durable inboxes of names not connected."""
