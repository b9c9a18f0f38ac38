"""The Streamlit page (minimal until the page is built): enqueue a turn and follow it."""

import streamlit as st

st.title("Agent")
st.write("The page is being built.")
