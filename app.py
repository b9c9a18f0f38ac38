"""The Streamlit page: `streamlit run app.py`. Wiring only; the page lives in agent/ui/."""

import streamlit as st

from agent.ui.shell import main

st.set_page_config(page_title="Agent clocks", page_icon="⏱️", layout="centered")
main()
