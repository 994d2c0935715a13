"""Test stand-in of SkyworkAI/skywork-o1-prm-inference's ``model_utils`` package (see prm_model)."""
