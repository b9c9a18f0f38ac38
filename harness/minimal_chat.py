"""A minimal Streamlit chat app (a title, the history, `st.chat_input`): the yardstick the page's first
screen is measured against (`streamlit run harness/minimal_chat.py`). It echoes what it is sent."""

import streamlit as st

st.title("Chat")
messages = st.session_state.setdefault("messages", [])
for message in messages:
    with st.chat_message(message["role"]):
        st.markdown(message["content"])
if prompt := st.chat_input("Say something"):
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"You said: {prompt}"}]
    st.rerun()
